package roam_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The README's Go code blocks, put together in order, are a program that
// builds and runs: the example a newcomer copies cannot rot.
func TestREADMEExampleRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a program")
	}
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	require.NotEmpty(t, blocks, "README.md has Go code blocks")
	var src strings.Builder
	for _, b := range blocks {
		src.WriteString(b[1])
		src.WriteString("\n")
	}
	// testdata is inside the module (so the program builds against this
	// checkout) and outside ./... (so nothing else builds it).
	dir := filepath.Join("testdata", "readme")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	t.Cleanup(func() {
		_ = os.RemoveAll(dir)
		_ = os.Remove("testdata") // only if nothing else is there
	})
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(src.String()), 0o644))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	vet, err := exec.CommandContext(ctx, "go", "vet", "./"+dir).CombinedOutput()
	require.NoError(t, err, "the README's code does not build:\n%s\n%s", vet, src.String())
	out, err := exec.CommandContext(ctx, "go", "run", "./"+dir).CombinedOutput()
	require.NoError(t, err, "the README's program failed:\n%s", out)
	// It prints what it says it prints, every time (a first call may
	// activate the cart on either node: it moves to the other).
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Equal(t, "1 2 true", lines[len(lines)-1], "the README program's output:\n%s", out)
	require.Contains(t, string(readme), `prints "1 2 true"`)
}
