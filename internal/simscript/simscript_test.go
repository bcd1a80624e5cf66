package simscript

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

const script = `# a comment
echo a b
----
a b

# an empty output
noop
----

echo-args k=v list=(x, y) bare
input line
----
k=[v] list=[x y] bare input="input line"

para
----
----
one

two
----
----
`

// echo is the handler the tests run: echo prints its words, echo-args
// describes how the line parsed, para prints output with a blank line.
func echo(c *Cmd) string {
	switch c.Name {
	case "echo":
		return strings.Join(c.Words(), " ")
	case "noop":
		return ""
	case "echo-args":
		var parts []string
		for _, a := range c.Args {
			if a.Vals == nil {
				c.Has(a.Key)
				parts = append(parts, a.Key)
				continue
			}
			vs, _ := c.Vals(a.Key)
			parts = append(parts, a.Key+"=["+strings.Join(vs, " ")+"]")
		}
		return strings.Join(parts, " ") + ` input="` + c.Input + `"`
	case "para":
		return "one\n\ntwo"
	}
	c.Fatalf("unknown command %s", c.Name)
	return ""
}

func TestParse(t *testing.T) {
	s, err := Parse("x.txt", script)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range s.blocks {
		got = append(got, b.cmd.Pos+" "+b.cmd.Name+" "+b.expected)
	}
	want := []string{
		"x.txt:2 echo a b",
		"x.txt:7 noop ",
		"x.txt:10 echo-args k=[v] list=[x y] bare input=\"input line\"",
		"x.txt:15 para one\n\ntwo",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parsed\n%q\nwant\n%q", got, want)
	}
	if in := s.blocks[2].cmd.Input; in != "input line" {
		t.Errorf("input %q", in)
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"cmd\n", `x.txt:1: "cmd" has no ---- line`},
		{"# c\ncmd\n\n----\n", `x.txt:2: "cmd" has no ---- line before the blank line 3`},
		{"cmd k=(a\n----\n", `x.txt:1: unclosed ( in "k=(a"`},
		{"cmd =v\n----\n", `x.txt:1: argument "=v" has no key`},
		{"cmd\n----\n----\nout\n", `x.txt:1: "cmd": the output opened with two ---- lines is not closed by two`},
	} {
		_, err := Parse("x.txt", c.text)
		if err == nil || err.Error() != c.want {
			t.Errorf("Parse(%q): %v, want %s", c.text, err, c.want)
		}
	}
}

func TestRunMatches(t *testing.T) {
	s, err := Parse("x.txt", script)
	if err != nil {
		t.Fatal(err)
	}
	ms, rewritten := s.Run(echo)
	if len(ms) > 0 {
		t.Fatalf("mismatches: %v", ms)
	}
	if rewritten != script {
		t.Fatalf("a script whose outputs match is rewritten as itself; got\n%s", rewritten)
	}
}

func TestRunReportsAMismatchAtItsLine(t *testing.T) {
	s, err := Parse("x.txt", strings.Replace(script, "echo a b\n----\na b\n", "echo a b\n----\na c\n", 1))
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := s.Run(echo)
	if len(ms) != 1 {
		t.Fatalf("want one mismatch, got %v", ms)
	}
	want := "x.txt:2: echo a b: output differs (-want +got):\n- a c\n+ a b\n"
	if got := ms[0].String(); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

// A rewrite replaces each expected output with the actual one, changing
// between the one- and two-separator forms as the output needs, and keeps
// the comments and commands.
func TestRewrite(t *testing.T) {
	stale := `# keep me
echo a b
----
old
old too

para
----
stale

noop
----
was not empty

# a comment
echo z
----
----
x

y
----
----
`
	want := `# keep me
echo a b
----
a b

para
----
----
one

two
----
----

noop
----

# a comment
echo z
----
z
`
	s, err := Parse("x.txt", stale)
	if err != nil {
		t.Fatal(err)
	}
	_, rewritten := s.Run(echo)
	if rewritten != want {
		t.Fatalf("rewritten:\n%s\nwant:\n%s\ndiff:\n%s", rewritten, want, Diff(want, rewritten))
	}
	again, err := Parse("x.txt", rewritten)
	if err != nil {
		t.Fatal(err)
	}
	if ms, _ := again.Run(echo); len(ms) > 0 {
		t.Fatalf("the rewritten script does not pass: %v", ms)
	}
}

func TestAnUnusedArgumentFailsTheScript(t *testing.T) {
	s, err := Parse("x.txt", "echo a\n----\na\n\nnoop typo=1\n----\n\necho b\n----\nb\n")
	if err != nil {
		t.Fatal(err)
	}
	ms, rewritten := s.Run(echo)
	if len(ms) != 1 || ms[0].Err != "noop does not take typo" || ms[0].Pos != "x.txt:5" {
		t.Fatalf("want one script error at x.txt:5, got %v", ms)
	}
	if !strings.HasSuffix(rewritten, "echo b\n----\nb\n") {
		t.Fatalf("commands after a script error keep their expected output:\n%s", rewritten)
	}
}

func TestFatalfNamesTheCommand(t *testing.T) {
	s, err := Parse("x.txt", "bogus\n----\n")
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := s.Run(echo)
	if len(ms) != 1 || ms[0].String() != "x.txt:1: bogus: unknown command bogus" {
		t.Fatalf("got %v", ms)
	}
}

func TestDiffElidesFarUnchangedLines(t *testing.T) {
	var want, got []string
	for i := 0; i < 20; i++ {
		want = append(want, string(rune('a'+i)))
	}
	got = append(got, want...)
	got[10] = "X"
	d := Diff(strings.Join(want, "\n"), strings.Join(got, "\n"))
	wantDiff := "  … 7 unchanged lines\n  h\n  i\n  j\n- k\n+ X\n  l\n  m\n  n\n  … 6 unchanged lines\n"
	if d != wantDiff {
		t.Fatalf("diff:\n%s\nwant:\n%s", d, wantDiff)
	}
}

func TestRunFileRewrites(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.txt")
	if err := os.WriteFile(p, []byte("echo a\n----\nstale\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := *Rewrite
	*Rewrite = true
	defer func() { *Rewrite = old }()
	RunFile(t, p, echo)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "echo a\n----\na\n" {
		t.Fatalf("file after -rewrite:\n%s", b)
	}
}

func TestHasTokens(t *testing.T) {
	for _, c := range []struct {
		line  string
		words []string
		want  bool
	}{
		{"c1 send m1 (seq 1) to s1 via n1.1", []string{"m1"}, true},
		{"c1 send m17 (seq 1) to s1 via n1.1", []string{"m1"}, false},
		{"c1 send m17 to s1 via n1.1", []string{"n1", "s1"}, true},
		{"c1 send m17 to s1 via n1.1", []string{"s1", "s2"}, false},
		{"n1.1:act:s1:op1 starts", []string{"act:s1"}, true},
		{"n1.1:act:s12:op1 starts", []string{"act:s1"}, false},
		{"anything", nil, true},
	} {
		if got := HasTokens(c.line, c.words); got != c.want {
			t.Errorf("HasTokens(%q, %q) = %v, want %v", c.line, c.words, got, c.want)
		}
	}
}

func TestNumberArgs(t *testing.T) {
	s, err := Parse("t", "args at=20ms n=3 count=all\n----\n20ms 3 -1\n\nargs\n----\n1s 7 1\n\nargs at=soon\n----\n")
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := s.Run(func(c *Cmd) string {
		return c.Dur("at", time.Second).String() + " " + strconv.Itoa(c.Int("n", 7)) + " " + strconv.Itoa(c.Count(1))
	})
	if len(ms) != 1 || !strings.Contains(ms[0].Err, `at=soon`) {
		t.Fatalf("want one script error for at=soon, got %v", ms)
	}
}
