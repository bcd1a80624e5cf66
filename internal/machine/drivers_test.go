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

// contextTimers are package context's functions that arm a timer on the
// system clock: a deadline of a driver is on its machine.Clock
// (machine.WithTimeout, machine.WithDeadline), or it would end on the
// real clock while the node runs in logical time.
var contextTimers = map[string]bool{"WithTimeout": true, "WithDeadline": true, "WithTimeoutCause": true, "WithDeadlineCause": true}

// drivers are the packages whose time is the node's clock: their
// non-test code reads no clock but a machine.Clock (machine.Real where
// the time is not a protocol decision, named so at the call).
var drivers = []string{
	"../relocation", "../spot", "../session", "../sessionhost", "../drain", "../checkpoint", "../meshnode", "../extension", "../placement", "../ask", "../operator",
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
			timeName, contextName := "", ""
			for _, imp := range f.Imports {
				name := ""
				if imp.Name != nil {
					name = imp.Name.Name
				}
				switch imp.Path.Value {
				case `"time"`:
					timeName = or(name, "time")
				case `"context"`:
					contextName = or(name, "context")
				}
			}
			if timeName == "" && contextName == "" {
				continue
			}
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				x, ok := sel.X.(*ast.Ident)
				switch {
				case !ok:
				case x.Name == timeName && timeReaders[sel.Sel.Name]:
					t.Errorf("%s: time.%s: read the driver's machine.Clock", fset.Position(sel.Pos()), sel.Sel.Name)
				case x.Name == contextName && contextTimers[sel.Sel.Name]:
					t.Errorf("%s: context.%s: a deadline on the driver's machine.Clock (machine.%s)", fset.Position(sel.Pos()), sel.Sel.Name, strings.TrimSuffix(sel.Sel.Name, "Cause"))
				}
				return true
			})
		}
	}
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
