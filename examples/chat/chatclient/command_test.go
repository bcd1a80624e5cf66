package chatclient_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/examples/chat/chatclient"
	"github.com/roamactors/roam/roamerr"
)

// A line is a post, a command, or a usage answer: a mistyped command or
// one without its argument is never posted to the room.
func TestParse(t *testing.T) {
	for _, c := range []struct {
		line string
		want chatclient.Command
	}{
		{"", chatclient.Command{Op: chatclient.OpNone}},
		{"   ", chatclient.Command{Op: chatclient.OpNone}},
		{"hello there ", chatclient.Command{Op: chatclient.OpPost, Arg: "hello there"}},
		{"//etc/passwd is a path", chatclient.Command{Op: chatclient.OpPost, Arg: "/etc/passwd is a path"}},
		{"/move node-3", chatclient.Command{Op: chatclient.OpMove, Arg: "node-3"}},
		{"  /move   node-3  ", chatclient.Command{Op: chatclient.OpMove, Arg: "node-3"}},
		{"/moveme node-1", chatclient.Command{Op: chatclient.OpMoveMe, Arg: "node-1"}},
		{"/quit", chatclient.Command{Op: chatclient.OpQuit}},
		{"/help", chatclient.Command{Op: chatclient.OpHelp}},
	} {
		got, err := chatclient.Parse(c.line)
		require.NoError(t, err, "%q", c.line)
		require.Equal(t, c.want, got, "%q", c.line)
	}
	for _, c := range []struct{ line, says string }{
		{"/move", "usage: /move NODE"},
		{"/move ", "usage: /move NODE"},
		{"/move a b", "usage: /move NODE"},
		{"/moveme", "usage: /moveme NODE"},
		{"/quit now", "/quit takes no argument"},
		{"/foo", "unknown command /foo"},
		{"/foo bar", "unknown command /foo"},
		{"/", "unknown command /"},
		{"/MOVE node-1", "unknown command /MOVE"},
	} {
		got, err := chatclient.Parse(c.line)
		require.ErrorIs(t, err, chatclient.ErrUsage, "%q", c.line)
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "%q", c.line)
		require.Contains(t, err.Error(), c.says, "%q", c.line)
		require.NotEqual(t, chatclient.OpPost, got.Op, "%q is not posted", c.line)
	}
	_, err := chatclient.Parse("/foo")
	require.Contains(t, err.Error(), chatclient.Usage, "an unknown command is answered with the commands")
}
