// Package simscript runs scenario scripts: files of commands, each with
// the output it must print, in the manner of etcd-io/raft's rafttest and
// cockroachdb/datadriven (which roam does not depend on). A script is a
// sequence of blocks:
//
//	# a comment, kept by -rewrite
//	command arg key=value key=(a,b)
//	optional input lines
//	----
//	expected output (may be empty)
//
// A blank line ends the expected output. Output that contains blank lines
// is written between two separator lines and closed by two:
//
//	command
//	----
//	----
//	first paragraph
//
//	second paragraph
//	----
//	----
//
// Run and RunFile hand each command to a handler and compare what it
// returns with the expected output; with -rewrite (the test flag this
// package registers) they write the actual outputs into the file instead,
// keeping every command and comment as it was.
package simscript

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Rewrite is the -rewrite test flag: scripts are rewritten with the actual
// outputs instead of compared with them.
var Rewrite = flag.Bool("rewrite", false, "rewrite scenario scripts (testdata/*.txt) with the actual outputs")

const sep = "----"

// Arg is one argument of a command: a bare word (no Vals) or key=value,
// key=(a,b) for several values.
type Arg struct {
	Key  string
	Vals []string
}

// Cmd is one command of a script.
type Cmd struct {
	// Pos is file:line of the command line.
	Pos   string
	Name  string
	Args  []Arg
	Input string
	// Line is the command line as written.
	Line string

	used map[int]bool
	err  error
}

// scriptError stops a command: the script itself is wrong (an unknown
// argument, a value that does not parse), not the system under test.
type scriptError struct{ msg string }

// Fatalf stops the command: the script is wrong. Run reports it at the
// command's position; it is never written into the expected output.
func (c *Cmd) Fatalf(format string, args ...any) {
	panic(scriptError{msg: fmt.Sprintf(format, args...)})
}

// Words returns the bare-word arguments, in order.
func (c *Cmd) Words() []string {
	var out []string
	for i, a := range c.Args {
		if a.Vals == nil {
			c.mark(i)
			out = append(out, a.Key)
		}
	}
	return out
}

// Has reports whether the bare word or key is present.
func (c *Cmd) Has(key string) bool {
	for i, a := range c.Args {
		if a.Key == key {
			c.mark(i)
			return true
		}
	}
	return false
}

// Vals returns the values of key, and whether it is present.
func (c *Cmd) Vals(key string) ([]string, bool) {
	for i, a := range c.Args {
		if a.Key == key && a.Vals != nil {
			c.mark(i)
			return a.Vals, true
		}
	}
	return nil, false
}

// Val returns the one value of key, or def if key is absent.
func (c *Cmd) Val(key, def string) string {
	vs, ok := c.Vals(key)
	if !ok {
		return def
	}
	if len(vs) != 1 {
		c.Fatalf("%s wants one value, has %d", key, len(vs))
	}
	return vs[0]
}

// Dur returns key's value as a duration (10ms, 4s), or def if key is
// absent.
func (c *Cmd) Dur(key string, def time.Duration) time.Duration {
	v := c.Val(key, "")
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		c.Fatalf("%s=%s: %v", key, v, err)
	}
	return d
}

// Int returns key's value as an integer, or def if key is absent.
func (c *Cmd) Int(key string, def int) int {
	v := c.Val(key, "")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		c.Fatalf("%s=%s: %v", key, v, err)
	}
	return n
}

// Count returns count=N, or -1 for count=all (every one), or def.
func (c *Cmd) Count(def int) int {
	if c.Val("count", "") == "all" {
		return -1
	}
	return c.Int("count", def)
}

func (c *Cmd) mark(i int) {
	if c.used == nil {
		c.used = map[int]bool{}
	}
	c.used[i] = true
}

// unused names the arguments the handler never looked at: a misspelt key
// must fail the script rather than be ignored.
func (c *Cmd) unused() []string {
	var out []string
	for i, a := range c.Args {
		if !c.used[i] {
			out = append(out, a.Key)
		}
	}
	return out
}

// block is one command with where its expected output sits in the file.
type block struct {
	cmd *Cmd
	// lines [start, end) of the file are the command, its input and the
	// separator; [end, next) the expected output and its closing lines.
	start, end, next int
	expected         string
}

// Script is a parsed script.
type Script struct {
	name   string
	lines  []string
	blocks []*block
}

// Parse parses a script; name is used in positions.
func Parse(name, text string) (*Script, error) {
	s := &Script{name: name, lines: strings.Split(text, "\n")}
	if n := len(s.lines); n > 0 && s.lines[n-1] == "" {
		s.lines = s.lines[:n-1]
	}
	ls := s.lines
	for i := 0; i < len(ls); {
		t := strings.TrimSpace(ls[i])
		if t == "" || strings.HasPrefix(t, "#") {
			i++
			continue
		}
		b := &block{start: i}
		cmd, err := parseLine(t)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, i+1, err)
		}
		cmd.Pos, cmd.Line = fmt.Sprintf("%s:%d", name, i+1), t
		i++
		var input []string
		for ; i < len(ls) && ls[i] != sep; i++ {
			if strings.TrimSpace(ls[i]) == "" {
				return nil, fmt.Errorf("%s: %q has no %s line before the blank line %d", cmd.Pos, t, sep, i+1)
			}
			input = append(input, ls[i])
		}
		if i == len(ls) {
			return nil, fmt.Errorf("%s: %q has no %s line", cmd.Pos, t, sep)
		}
		cmd.Input = strings.Join(input, "\n")
		i++
		b.end = i
		var out []string
		if i < len(ls) && ls[i] == sep {
			// The two-separator form: up to the closing pair.
			i++
			for ; i < len(ls) && !(ls[i] == sep && i+1 < len(ls) && ls[i+1] == sep); i++ {
				out = append(out, ls[i])
			}
			if i == len(ls) {
				return nil, fmt.Errorf("%s: %q: the output opened with two %s lines is not closed by two", cmd.Pos, t, sep)
			}
			i += 2
		} else {
			for ; i < len(ls) && strings.TrimSpace(ls[i]) != ""; i++ {
				out = append(out, ls[i])
			}
		}
		b.next = i
		b.expected = strings.Join(out, "\n")
		b.cmd = cmd
		s.blocks = append(s.blocks, b)
	}
	return s, nil
}

// parseLine splits a command line into the command and its arguments.
func parseLine(line string) (*Cmd, error) {
	var fields []string
	for rest := line; rest != ""; {
		rest = strings.TrimLeft(rest, " \t")
		if rest == "" {
			break
		}
		end := strings.IndexAny(rest, " \t")
		if eq := strings.Index(rest, "=("); eq >= 0 && (end < 0 || eq < end) {
			close := strings.Index(rest, ")")
			if close < 0 {
				return nil, fmt.Errorf("unclosed ( in %q", rest)
			}
			end = close + 1
		}
		if end < 0 {
			end = len(rest)
		}
		fields = append(fields, rest[:end])
		rest = rest[end:]
	}
	c := &Cmd{Name: fields[0]}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		switch {
		case !ok:
			c.Args = append(c.Args, Arg{Key: f})
		case k == "":
			return nil, fmt.Errorf("argument %q has no key", f)
		case strings.HasPrefix(v, "("):
			vals := []string{}
			for _, x := range strings.Split(strings.TrimSuffix(strings.TrimPrefix(v, "("), ")"), ",") {
				if x = strings.TrimSpace(x); x != "" {
					vals = append(vals, x)
				}
			}
			c.Args = append(c.Args, Arg{Key: k, Vals: vals})
		default:
			c.Args = append(c.Args, Arg{Key: k, Vals: []string{v}})
		}
	}
	return c, nil
}

// Mismatch is a command whose output differs from the expected one, or
// that the script got wrong (Err).
type Mismatch struct {
	Pos, Line      string
	Want, Got, Err string
}

func (m Mismatch) String() string {
	if m.Err != "" {
		return fmt.Sprintf("%s: %s: %s", m.Pos, m.Line, m.Err)
	}
	return fmt.Sprintf("%s: %s: output differs (-want +got):\n%s", m.Pos, m.Line, Diff(m.Want, m.Got))
}

// Run runs every command of the script through handle. It returns the
// commands whose output differs or that failed, and the script with the
// actual outputs in place of the expected ones. A command the script got
// wrong stops the run: later commands would run against a state the
// script did not mean.
func (s *Script) Run(handle func(*Cmd) string) (mismatches []Mismatch, rewritten string) {
	outs := make([]string, len(s.blocks))
	for i, b := range s.blocks {
		got, err := call(handle, b.cmd)
		if err != nil {
			mismatches = append(mismatches, Mismatch{Pos: b.cmd.Pos, Line: b.cmd.Line, Err: err.Error()})
			outs = outs[:i]
			break
		}
		outs[i] = got
		if got != b.expected {
			mismatches = append(mismatches, Mismatch{Pos: b.cmd.Pos, Line: b.cmd.Line, Want: b.expected, Got: got})
		}
	}
	return mismatches, s.rewrite(outs)
}

func call(handle func(*Cmd) string, c *Cmd) (out string, err error) {
	c.used = nil
	defer func() {
		if r := recover(); r != nil {
			se, ok := r.(scriptError)
			if !ok {
				panic(r)
			}
			err = errors.New(se.msg)
		}
	}()
	out = strings.TrimRight(handle(c), "\n")
	if u := c.unused(); len(u) > 0 {
		return "", fmt.Errorf("%s does not take %s", c.Name, strings.Join(u, ", "))
	}
	return out, nil
}

// rewrite returns the script with outs in place of the expected outputs;
// blocks past len(outs) keep theirs.
func (s *Script) rewrite(outs []string) string {
	var b strings.Builder
	line := func(l string) { b.WriteString(l); b.WriteByte('\n') }
	at := 0
	for i, bl := range s.blocks {
		for ; at < bl.end; at++ {
			line(s.lines[at])
		}
		if i >= len(outs) {
			break
		}
		out := outs[i]
		switch {
		case out == "":
		case hasBlankLine(out):
			line(sep)
			line(out)
			line(sep)
			line(sep)
		default:
			line(out)
		}
		at = bl.next
	}
	for ; at < len(s.lines); at++ {
		line(s.lines[at])
	}
	return b.String()
}

func hasBlankLine(s string) bool {
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) == "" {
			return true
		}
	}
	return false
}

// RunFile runs the script at path through handle and fails t at each
// command whose output differs, naming file:line and showing the
// difference; with -rewrite it writes the actual outputs into the file.
func RunFile(t testing.TB, path string, handle func(*Cmd) string) {
	t.Helper()
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Parse(path, string(text))
	if err != nil {
		t.Fatal(err)
	}
	ms, rewritten := s.Run(handle)
	if *Rewrite {
		if rewritten != string(text) {
			if err := os.WriteFile(path, []byte(rewritten), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s rewritten", path)
		}
		for _, m := range ms {
			if m.Err != "" {
				t.Error(m)
			}
		}
		return
	}
	for _, m := range ms {
		t.Error(m)
	}
}

// RunDir runs every *.txt script under dir as a subtest named after the
// file, each with a handler from newHandler (a fresh environment per
// script).
func RunDir(t *testing.T, dir string, newHandler func(t *testing.T) func(*Cmd) string) {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatalf("no scripts in %s", dir)
	}
	sort.Strings(paths)
	for _, p := range paths {
		t.Run(strings.TrimSuffix(filepath.Base(p), ".txt"), func(t *testing.T) {
			RunFile(t, p, newHandler(t))
		})
	}
}

// HasTokens reports whether line contains each of words as a whole
// token: where a word starts or ends with a letter or digit, the line
// must not have another one there, so m1 does not match m17 while n1
// matches n1.2 (a dot ends a token).
func HasTokens(line string, words []string) bool {
	for _, wd := range words {
		if !hasToken(line, wd) {
			return false
		}
	}
	return true
}

func hasToken(l, wd string) bool {
	isWord := func(b byte) bool {
		return b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
	}
	if wd == "" {
		return true
	}
	for i := 0; ; {
		j := strings.Index(l[i:], wd)
		if j < 0 {
			return false
		}
		j += i
		end := j + len(wd)
		if (j == 0 || !isWord(l[j-1]) || !isWord(wd[0])) && (end == len(l) || !isWord(l[end]) || !isWord(wd[len(wd)-1])) {
			return true
		}
		i = j + 1
	}
}

// Diff is a line diff of want and got: unchanged lines start with two
// spaces, removed ones with "- ", added ones with "+ ".
func Diff(want, got string) string {
	a, b := splitLines(want), splitLines(got)
	// lcs[i][j]: the longest common subsequence of a[i:] and b[j:].
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var ops []string
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			ops = append(ops, "  "+a[i])
			i, j = i+1, j+1
		case i < len(a) && (j == len(b) || lcs[i+1][j] >= lcs[i][j+1]):
			ops = append(ops, "- "+a[i])
			i++
		default:
			ops = append(ops, "+ "+b[j])
			j++
		}
	}
	// Unchanged lines more than diffContext away from a change are elided:
	// a long status or trace shows only where it differs.
	near := make([]bool, len(ops))
	for k, op := range ops {
		if op[0] != ' ' {
			for x := max(0, k-diffContext); x <= min(len(ops)-1, k+diffContext); x++ {
				near[x] = true
			}
		}
	}
	var d strings.Builder
	for k := 0; k < len(ops); k++ {
		if near[k] {
			d.WriteString(ops[k] + "\n")
			continue
		}
		skip := k
		for skip < len(ops) && !near[skip] {
			skip++
		}
		fmt.Fprintf(&d, "  … %d unchanged lines\n", skip-k)
		k = skip - 1
	}
	return d.String()
}

const diffContext = 3

func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}
