// Package apicheck finds internal types in the public API: every type a
// user of roam passes or receives must be declared in a public package,
// with its fields documented, so that go doc shows it and a user outside
// the module can build it. `make lint` runs its test over the module.
package apicheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Finding is one exported identifier whose declaration names an internal
// package's type.
type Finding struct {
	Pos  string // file:line
	What string
}

func (f Finding) String() string { return f.Pos + ": " + f.What }

// Public lists the directories under root that hold public library
// packages: not internal, not a command, example, benchmark or tool.
func Public(root string) ([]string, error) {
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		first := strings.Split(rel, string(filepath.Separator))[0]
		switch first {
		case "internal", "cmd", "examples", "bench", "chaos", "tools", "testdata", "docs":
			return filepath.SkipDir
		}
		if strings.HasPrefix(d.Name(), ".") && rel != "." {
			return filepath.SkipDir
		}
		files, _ := filepath.Glob(filepath.Join(path, "*.go"))
		for _, f := range files {
			if !strings.HasSuffix(f, "_test.go") {
				dirs = append(dirs, path)
				break
			}
		}
		return nil
	})
	return dirs, err
}

// Check parses the non-test files of the package in dir and reports every
// exported type, alias, field, function, method or variable whose
// declaration mentions a type of a package under internal/.
func Check(dir string) ([]Finding, error) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		return nil, err
	}
	var out []Finding
	for name, pkg := range pkgs {
		if name == "main" {
			continue
		}
		for _, file := range pkg.Files {
			internal := map[string]bool{}
			for _, imp := range file.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if !strings.Contains(path, "/internal/") && !strings.HasSuffix(path, "/internal") {
					continue
				}
				local := filepath.Base(path)
				if imp.Name != nil {
					local = imp.Name.Name
				}
				internal[local] = true
			}
			if len(internal) == 0 {
				continue
			}
			report := func(at ast.Node, what string, expr ast.Expr) {
				if expr == nil {
					return
				}
				ast.Inspect(expr, func(n ast.Node) bool {
					sel, ok := n.(*ast.SelectorExpr)
					if !ok {
						return true
					}
					if id, ok := sel.X.(*ast.Ident); ok && internal[id.Name] {
						p := fset.Position(at.Pos())
						out = append(out, Finding{fmt.Sprintf("%s:%d", p.Filename, p.Line), fmt.Sprintf("%s uses %s.%s", what, id.Name, sel.Sel.Name)})
					}
					return false
				})
			}
			fields := func(what string, fl *ast.FieldList, exportedOnly bool) {
				if fl == nil {
					return
				}
				for _, f := range fl.List {
					if exportedOnly {
						exported := len(f.Names) == 0 // embedded
						for _, n := range f.Names {
							exported = exported || n.IsExported()
						}
						if !exported {
							continue
						}
					}
					report(f, what, f.Type)
				}
			}
			for _, decl := range file.Decls {
				switch d := decl.(type) {
				case *ast.FuncDecl:
					if !d.Name.IsExported() {
						continue
					}
					what := "func " + d.Name.Name
					if d.Recv != nil {
						recv := d.Recv.List[0].Type
						if star, ok := recv.(*ast.StarExpr); ok {
							recv = star.X
						}
						if id, ok := recv.(*ast.Ident); !ok || !id.IsExported() {
							continue
						}
						what = "method " + d.Name.Name
					}
					fields(what, d.Type.Params, false)
					fields(what, d.Type.Results, false)
				case *ast.GenDecl:
					for _, spec := range d.Specs {
						switch s := spec.(type) {
						case *ast.TypeSpec:
							if !s.Name.IsExported() {
								continue
							}
							what := "type " + s.Name.Name
							switch t := s.Type.(type) {
							case *ast.StructType:
								fields(what, t.Fields, true)
							case *ast.InterfaceType:
								for _, m := range t.Methods.List {
									report(m, what, m.Type)
								}
							default:
								report(s, what, s.Type)
							}
						case *ast.ValueSpec:
							for i, n := range s.Names {
								if !n.IsExported() {
									continue
								}
								report(s, "var/const "+n.Name, s.Type)
								if d.Tok == token.VAR && i < len(s.Values) {
									// An exported var bound to an internal
									// function re-exports its signature.
									if sel, ok := s.Values[i].(*ast.SelectorExpr); ok {
										report(s, "var/const "+n.Name, sel)
									}
								}
							}
						}
					}
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pos < out[j].Pos })
	return out, nil
}
