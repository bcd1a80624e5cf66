package spot

// SetNewIDForTest replaces the Create ID generator; the returned function
// restores it.
func SetNewIDForTest(f func() string) func() {
	old := newID
	newID = f
	return func() { newID = old }
}

// NewIDCalls counts the IDs Create issued.
func NewIDCalls() int64 { return newIDCalls.Load() }

// CachedRoutes is the number of routes m caches.
func CachedRoutes(m *Manager) int { return m.cache.len() }

// CachedOwner is the owner node RID of m's cached route to id, if cached.
func CachedOwner(m *Manager, id string) (string, bool) {
	a, ok, _ := m.cache.get(id)
	return a.v.Record.GetOwner().GetNodeRid(), ok
}
