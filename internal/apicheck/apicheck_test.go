package apicheck

import (
	"os"
	"path/filepath"
	"testing"
)

// No public package of the module names an internal type in its exported
// API.
func TestNoInternalTypesInPublicAPI(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := Public(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 5 {
		t.Fatalf("found only %d public packages under %s: %v", len(dirs), root, dirs)
	}
	for _, dir := range dirs {
		found, err := Check(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range found {
			t.Errorf("%s", f)
		}
	}
}

// The check finds what it is for: an alias, a field, a parameter and a
// re-exported function of an internal package.
func TestCheckFindsInternalTypes(t *testing.T) {
	dir := t.TempDir()
	src := `package pub

import (
	"example.com/m/internal/thing"
	inner "example.com/m/internal/other"
)

type Alias = thing.T
type S struct {
	Exported thing.T
	hidden   thing.T
}
func F(x inner.T) {}
func G() (thing.T, error) { return thing.T{}, nil }
var H = thing.New
func ok(x thing.T) {}
type Fine struct{ N int }
`
	if err := os.WriteFile(filepath.Join(dir, "pub.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	found, err := Check(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 5 {
		t.Fatalf("want 5 findings (Alias, S.Exported, F, G, H), got %d: %v", len(found), found)
	}
}
