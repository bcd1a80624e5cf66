package sessionhost

import "context"

// Held is how many client messages the Session holds for actor.
func (c *Session) Held(actor string) int {
	n := 0
	_ = c.svc.do(context.Background(), func() { n = c.svc.runner.Owner().Held(c.id, actor) })
	return n
}

// Sealed reports whether actor's binding is sealed.
func (c *Session) Sealed(actor string) bool {
	sealed := false
	_ = c.svc.do(context.Background(), func() { _, sealed, _ = c.svc.runner.Owner().BindingOf(c.id, actor) })
	return sealed
}

// DropCommands makes the Session owner of c's node drop the commands f
// returns true for (nil: none).
func (c *Session) DropCommands(f func(msg any) bool) {
	if f == nil {
		c.svc.dropCommands.Store(nil)
		return
	}
	c.svc.dropCommands.Store(&f)
}

// Self is the Session owner actor's PID.
func (c *Session) Self() any { return c.svc.self }
