package machine_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// timeReaders are package time's functions that read or wait on the
// system clock.
var timeReaders = map[string]bool{
	"Now": true, "Since": true, "Until": true, "AfterFunc": true, "NewTimer": true,
	"NewTicker": true, "After": true, "Tick": true, "Sleep": true,
}

// drivers are the packages whose time is the node's clock: their
// non-test code reads no clock but a machine.Clock (machine.Real where
// the time is not a protocol decision, named so at the call).
var drivers = []string{
	"../relocation", "../spot", "../session", "../drain", "../checkpoint", "../meshnode", "../extension", "../placement",
}

// The drivers read time only through a machine.Clock, so a node runs in
// logical time under machine.Manual and no protocol timer escapes it.
func TestDriversReadTimeThroughTheClock(t *testing.T) {
	fset := token.NewFileSet()
	for _, dir := range drivers {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no Go files in %s: %v", dir, err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			timeName := ""
			for _, imp := range f.Imports {
				if imp.Path.Value == `"time"` {
					timeName = "time"
					if imp.Name != nil {
						timeName = imp.Name.Name
					}
				}
			}
			if timeName == "" {
				continue
			}
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == timeName && timeReaders[sel.Sel.Name] {
					t.Errorf("%s: time.%s: read the driver's machine.Clock", fset.Position(sel.Pos()), sel.Sel.Name)
				}
				return true
			})
		}
	}
}
