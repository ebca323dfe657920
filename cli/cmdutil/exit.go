// Package cmdutil holds what gpujob's commands share that is not a library
// of their subject: how a command hands main its exit code.
package cmdutil

// ExitError carries an exit code to main: a command returns one when its
// failure has a code of its own (e.g. `submit --no-queue`'s not placed).
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }
