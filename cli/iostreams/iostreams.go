// Package iostreams holds a command's input and output, so tests can give a
// command buffers and ask for TTY or script output.
package iostreams

import (
	"bytes"
	"io"
	"os"
)

// IOStreams are a command's streams.
type IOStreams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
	// IsTTY is true when Out is a terminal: live progress and colour-free
	// tables for people; plain lines otherwise.
	IsTTY bool
}

// System returns the process's streams.
func System() *IOStreams {
	tty := false
	if fi, err := os.Stdout.Stat(); err == nil {
		tty = fi.Mode()&os.ModeCharDevice != 0
	}
	return &IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr, IsTTY: tty}
}

// Test returns streams backed by buffers: (streams, stdin, stdout, stderr).
func Test() (*IOStreams, *bytes.Buffer, *bytes.Buffer, *bytes.Buffer) {
	in, out, errOut := &bytes.Buffer{}, &bytes.Buffer{}, &bytes.Buffer{}
	return &IOStreams{In: in, Out: out, ErrOut: errOut}, in, out, errOut
}
