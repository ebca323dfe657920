// Package pylaunch reads a Python command line (interpreter, options,
// script or -m module, arguments) the way the interpreter would, for the
// gpujob supervisor's preloaded interpreters, which must start the user's
// script exactly as `python3 script.py` would, and for the CLI, which
// checks a spec's preload against its command before submitting.
package pylaunch

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
)

// Module reports whether name is a dotted Python module name (torch,
// torch.distributed); nothing else may reach an interpreter's command line.
func Module(name string) bool { return module.MatchString(name) }

var module = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)

var interpreter = regexp.MustCompile(`^python[0-9.]*$`)

// Launch is how a rank's command line maps onto the zygote: a script
// (python3 [-u] [-B] script.py args...) or a module (python3 -m mod args...).
type Launch struct {
	Module     bool
	Target     string   // script path or module name
	Argv       []string // sys.argv as Python would set it before the run
	Unbuffered bool     // -u
	NoBytecode bool     // -B
}

// Parse checks that command is a Python interpreter and args a
// command line the zygote can reproduce exactly; the error names what is not.
func Parse(command string, args []string) (Launch, error) {
	if !interpreter.MatchString(filepath.Base(command)) {
		return Launch{}, fmt.Errorf("preload needs a Python interpreter as command (python3, python3.11, ...), got %q", command)
	}
	var l Launch
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-u":
			l.Unbuffered = true
		case a == "-B":
			l.NoBytecode = true
		case a == "-m":
			if i+1 >= len(args) || !Module(args[i+1]) {
				return Launch{}, fmt.Errorf("preload: args: -m needs a module name")
			}
			l.Module, l.Target = true, args[i+1]
			l.Argv = append([]string{"-m"}, args[i+2:]...)
			return l, nil
		case a == "-" || strings.HasPrefix(a, "-"):
			return Launch{}, fmt.Errorf("preload: args[%d]: interpreter option %q is not supported with preload (only -u, -B and -m); drop it or drop preload", i, a)
		default:
			l.Target = a
			l.Argv = append([]string{}, args[i:]...)
			return l, nil
		}
	}
	return Launch{}, fmt.Errorf("preload: args name no script or -m module to run")
}
