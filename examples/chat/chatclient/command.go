package chatclient

import (
	"errors"
	"fmt"
	"strings"

	"github.com/roamactors/roam/roamerr"
)

// Op is what a typed line asks for.
type Op int

const (
	// OpNone: an empty line, nothing to do.
	OpNone Op = iota
	// OpPost posts Command.Arg to the room.
	OpPost
	// OpMove moves the room to the node Command.Arg names.
	OpMove
	// OpMoveMe moves the user's own Actor to the node Command.Arg names.
	OpMoveMe
	// OpHelp shows Usage.
	OpHelp
	// OpQuit leaves the room and disconnects.
	OpQuit
)

// Command is one typed line, parsed.
type Command struct {
	Op  Op
	Arg string // the post's text, or the node's name
}

// Usage lists the commands a line may hold.
const Usage = "commands: /move NODE moves the room to NODE, /moveme NODE moves your own Actor to NODE, /help, /quit; //text posts /text"

// ErrUsage: a line that starts with / but is no command as written. It
// is answered with how to write it, never posted: a mistyped command
// would otherwise go to everyone in the room. Parse's errors match it
// (errors.Is) and roamerr.ErrInvalidOperation; their text is the answer
// for the user alone.
var ErrUsage = errors.New("chatclient: not a command")

type usageError struct{ msg string }

func (e *usageError) Error() string        { return e.msg }
func (e *usageError) Is(target error) bool { return target == ErrUsage }
func (e *usageError) Unwrap() error        { return roamerr.ErrInvalidOperation }

// Parse reads one typed line. A line without a leading / is a post (its
// surrounding spaces trimmed); "//" posts a line that starts with "/".
func Parse(line string) (Command, error) {
	line = strings.TrimSpace(line)
	switch {
	case line == "":
		return Command{Op: OpNone}, nil
	case strings.HasPrefix(line, "//"):
		return Command{Op: OpPost, Arg: line[1:]}, nil
	case !strings.HasPrefix(line, "/"):
		return Command{Op: OpPost, Arg: line}, nil
	}
	word, rest, _ := strings.Cut(line, " ")
	args := strings.Fields(rest)
	usage := func(form, what string) (Command, error) {
		return Command{}, &usageError{fmt.Sprintf("usage: %s (%s)", form, what)}
	}
	switch word {
	case "/move", "/moveme":
		form, what, op := "/move NODE", "moves the room to the node named NODE", OpMove
		if word == "/moveme" {
			form, what, op = "/moveme NODE", "moves your own Actor to the node named NODE; you stay connected", OpMoveMe
		}
		if len(args) != 1 {
			return usage(form, what)
		}
		return Command{Op: op, Arg: args[0]}, nil
	case "/quit", "/help":
		if len(args) != 0 {
			return usage(word, word+" takes no argument")
		}
		if word == "/quit" {
			return Command{Op: OpQuit}, nil
		}
		return Command{Op: OpHelp}, nil
	}
	return Command{}, &usageError{fmt.Sprintf("unknown command %s; %s", clip(word), Usage)}
}

// clip shortens what a user typed before it is echoed.
func clip(s string) string {
	const max = 40
	if r := []rune(s); len(r) > max {
		return string(r[:max]) + "…"
	}
	return s
}
