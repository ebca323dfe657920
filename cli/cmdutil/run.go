package cmdutil

import "context"

// Run is a command's RunE body: it calls runF, the tests' seam, when one is
// set and run otherwise, with the command's context (Background when cobra
// gave none, as when a test calls RunE directly).
func Run[O any](ctx context.Context, o *O, runF func(context.Context, *O) error, run func(context.Context) error) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if runF != nil {
		return runF(ctx, o)
	}
	return run(ctx)
}
