package testwait

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fatalRecorder is a test whose Fatalf is recorded, and ends its goroutine
// as testing's does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Deadline() (time.Time, bool) { return time.Time{}, false }

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestRecvReturnsWhatIsSentOrTheClose(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if got := Recv(t, ch, "a value"); got != 7 {
		t.Fatalf("Recv returned %d, want 7", got)
	}
	close(ch)
	if got := Recv(t, ch, "the close"); got != 0 {
		t.Fatalf("Recv of a closed channel returned %d, want 0", got)
	}
}

// A receive nothing sends to fails once the bound is spent, naming what it
// waited for, instead of holding the test.
func TestRecvFailsNamingWhatItWaitedFor(t *testing.T) {
	defer func(b time.Duration) { Bound = b }(Bound)
	Bound = 20 * time.Millisecond
	f := &fatalRecorder{TB: t}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		Recv(f, make(chan struct{}), "the gate")
	}()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("Recv did not give up within 10 s of a 20 ms bound")
	}
	if !strings.Contains(f.msg, "the gate") || !strings.Contains(f.msg, "20ms") {
		t.Fatalf("Recv failed with %q, which should name the gate and 20ms", f.msg)
	}
}
