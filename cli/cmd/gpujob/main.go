// Command gpujob is the gpujob CLI; main only wires the packages together.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/command/root"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	f := &factory.Factory{IO: iostreams.System(), Now: time.Now}
	cmd := root.NewCmd(f)
	cmd.SetArgs(root.NormalizeArgs(cmd, os.Args[1:]))
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "gpujob:", err)
	var exit *cmdutil.ExitError
	if errors.As(err, &exit) {
		os.Exit(exit.Code)
	}
	os.Exit(1)
}
