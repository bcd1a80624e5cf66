package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Every flag is checked before anything starts: --rooms 0 would panic
// choosing a room to move, a negative duration would end at once with no
// move, and so on.
func TestFlagsAreChecked(t *testing.T) {
	type flags struct {
		args                    []string
		store, consul, chatNode string
		duration                time.Duration
		rooms                   int
		postEvery, pause        time.Duration
		fault, tlsDir, says     string
	}
	ok := flags{store: "memory", duration: 20 * time.Second, rooms: 10, fault: "kill", pause: 25 * time.Second}
	check := func(f flags) error {
		postEvery, fault, storePause, tlsDir = f.postEvery, f.fault, f.pause, f.tlsDir
		t.Cleanup(func() { postEvery, fault, storePause, tlsDir = 0, "", 0, "" })
		return checkFlags(f.args, f.store, f.consul, f.chatNode, f.duration, f.rooms)
	}
	require.NoError(t, check(ok))
	for _, c := range []func(*flags){
		func(f *flags) { f.rooms, f.says = 0, "--rooms must be from 1 to 1000, got 0" },
		func(f *flags) { f.rooms, f.says = -5, "--rooms must be from 1 to 1000, got -5" },
		func(f *flags) { f.rooms, f.says = 1001, "--rooms must be from 1 to 1000" },
		func(f *flags) { f.duration, f.says = 0, "--duration must be more than 0" },
		func(f *flags) { f.duration, f.says = -time.Second, "--duration must be more than 0" },
		func(f *flags) { f.postEvery, f.says = -time.Millisecond, "--post-every must be from 0" },
		func(f *flags) { f.store, f.says = "etcd", "--store must be memory or consul" },
		func(f *flags) { f.chatNode, f.says = "/bin/true", "--chat-node needs --store consul" },
		func(f *flags) { f.consul, f.says = "127.0.0.1:8500", "--consul needs --store consul" },
		func(f *flags) { f.fault, f.says = "flood", "--fault must be kill or consul-pause" },
		func(f *flags) { f.fault, f.says = "consul-pause", "--fault consul-pause needs --store consul" },
		func(f *flags) { f.pause, f.says = 0, "--pause must be more than 0" },
		func(f *flags) {
			f.store, f.chatNode, f.says = "consul", "/nonexistent/chat-node", "--chat-node must be the chat-node binary"
		},
		func(f *flags) { f.tlsDir, f.says = "/nonexistent/certs", "--tls-dir must be a directory" },
		func(f *flags) { f.args, f.says = []string{"now"}, `unexpected argument "now"` },
	} {
		f := ok
		c(&f)
		err := check(f)
		require.Error(t, err, "%+v", f)
		require.Contains(t, err.Error(), f.says)
	}
}
