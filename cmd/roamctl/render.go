package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/roamactors/roam/internal/operator"
	"github.com/roamactors/roam/messages"
)

// table writes aligned columns; the first row is the header.
func table(w io.Writer, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// writeJSON writes v as one JSON document on one line.
func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// statusJSON is a status note as JSON (the note's own protojson form).
func statusJSON(st *messages.OperatorStatus) json.RawMessage {
	b, err := operator.Encode(st)
	if err != nil || len(b) == 0 {
		return json.RawMessage("{}")
	}
	return b
}

// dur prints a duration rounded for people: 950µs, 12.3ms, 4.2s, 3m05s.
func dur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	}
	return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
}

func ms(nanos int64) float64 { return float64(nanos) / 1e6 }

// bytesStr prints a size: 512 B, 1.5 KiB, 2.0 MiB.
func bytesStr(n uint64) string {
	switch {
	case n < 1024:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/1024)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// progress is what one line of a drain's progress shows.
type progress struct {
	total, moved, failed uint32
	rate                 float64 // units per second, 0 unknown
	elapsed              time.Duration
}

func progressOf(st *messages.OperatorStatus, elapsed time.Duration) progress {
	p := progress{total: st.GetTotal(), moved: st.GetMoved(), failed: st.GetFailed(), elapsed: elapsed}
	// The rate is measured on the node's clock, from its own timestamps.
	if start, upd := st.GetStartedUnixNanos(), st.GetUpdatedUnixNanos(); start > 0 && upd > start {
		p.rate = float64(p.moved+p.failed) / (float64(upd-start) / 1e9)
	}
	return p
}

// eta is the time left at the current rate; ok is false when unknown.
func (p progress) eta() (time.Duration, bool) {
	if p.total == 0 {
		return 0, false // the node has not counted its units yet
	}
	left := int64(p.total) - int64(p.moved) - int64(p.failed)
	if left <= 0 {
		return 0, true
	}
	if p.rate <= 0 {
		return 0, false
	}
	return time.Duration(float64(left) / p.rate * float64(time.Second)), true
}

const barWidth = 24

// bar is the progress bar line a terminal redraws in place.
func (p progress) bar() string {
	done := int(p.moved + p.failed)
	filled := 0
	if p.total > 0 {
		filled = min(barWidth*done/int(p.total), barWidth)
	}
	return "[" + strings.Repeat("#", filled) + strings.Repeat(".", barWidth-filled) + "] " + p.counts()
}

// counts is the figures of a progress line.
func (p progress) counts() string {
	rate, eta := "-", "-"
	if p.rate > 0 {
		rate = fmt.Sprintf("%.1f", p.rate)
	}
	if d, ok := p.eta(); ok {
		eta = dur(d)
	}
	return fmt.Sprintf("%d/%d moved, %d failed, %s units/s, ETA %s, elapsed %s",
		p.moved, p.total, p.failed, rate, eta, dur(p.elapsed))
}

// liveLine redraws one line of a terminal in place.
type liveLine struct {
	w    io.Writer
	last int // length of the line drawn last
}

func (l *liveLine) draw(s string) {
	pad := ""
	if n := l.last - len(s); n > 0 {
		pad = strings.Repeat(" ", n)
	}
	fmt.Fprint(l.w, "\r"+s+pad)
	l.last = len(s)
}

// end leaves the line as drawn and moves to the next one.
func (l *liveLine) end() {
	if l.last > 0 {
		fmt.Fprintln(l.w)
		l.last = 0
	}
}
