package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A numeric flag out of its range is refused when the command line is
// read (exit status 2), the message naming the flag and the range; before,
// -timeout -1s and watch -count -1 ran (the first timed out at once, the
// second never stopped) and drain -concurrency wrapped past 2^32.
func TestNumericFlagsOutOfRangeAreRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-timeout", "-1s", "nodes"}, `invalid value "-1s" for flag -timeout: want a duration from 0s to 8760h0m0s`},
		{[]string{"nodes", "-timeout=-5m"}, `invalid value "-5m" for flag -timeout: want a duration from 0s to 8760h0m0s`},
		{[]string{"nodes", "-timeout", "9000h"}, `invalid value "9000h" for flag -timeout: want a duration from 0s to 8760h0m0s`},
		{[]string{"watch", "-count", "-1"}, `invalid value "-1" for flag -count: want a whole number from 0 to 1073741824`},
		{[]string{"watch", "-count", "2147483648"}, `invalid value "2147483648" for flag -count: want a whole number from 0 to 1073741824`},
		{[]string{"drain", "node-a", "-concurrency", "-1"}, `invalid value "-1" for flag -concurrency: want a whole number from 0 to 256`},
		{[]string{"drain", "node-a", "-concurrency", "4294967297"}, `invalid value "4294967297" for flag -concurrency: want a whole number from 0 to 256`},
		{[]string{"drain", "node-a", "-concurrency", "257"}, `invalid value "257" for flag -concurrency: want a whole number from 0 to 256`},
	} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, exitUsage, run(c.args, &stdout, &stderr), c.args)
		require.Contains(t, stderr.String(), c.want, c.args)
	}

	// The ends of each range are taken.
	var stdout, stderr bytes.Buffer
	inv, _ := parse([]string{"-timeout", "0s", "watch", "-count", "0"}, &stdout, &stderr)
	require.NotNil(t, inv, stderr.String())
	require.Zero(t, inv.globals.timeout)
	inv, _ = parse([]string{"drain", "node-a", "-concurrency", "256", "-timeout", "8760h"}, &stdout, &stderr)
	require.NotNil(t, inv, stderr.String())
	require.Equal(t, 256, inv.flags.concurrency)
	require.Equal(t, 8760*time.Hour, inv.globals.timeout)
	inv, _ = parse([]string{"watch", "-count", "1073741824"}, &stdout, &stderr)
	require.NotNil(t, inv, stderr.String())
	require.Equal(t, 1<<30, inv.flags.count)
}
