package service

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	"github.com/hashicorp/nomad/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/internal/contract"
)

func newLogsCmd(f *factory.Factory) *cobra.Command {
	var follow, stderr bool
	var alloc string
	cmd := &cobra.Command{
		Use:   "logs NAME",
		Short: "Show the logs of a service's running replicas, each line prefixed with its replica",
		Long: `Logs prints the stdout (or, with --stderr, the stderr) of every running
replica of the service, each line prefixed "[<alloc name> <version>] ".
--alloc picks one replica by its allocation ID (a prefix will do). --follow
streams them all at once until Ctrl-C.`,
		Example: `  gpujob service logs bert-clf
  gpujob service logs bert-clf --stderr -f
  gpujob service logs bert-clf --alloc 3f2a`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			nomad, err := f.Nomad()
			if err != nil {
				return err
			}
			if _, err := loadService(nomad, args[0]); err != nil {
				return err
			}
			stream := "stdout"
			if stderr {
				stream = "stderr"
			}
			return replicaLogs(ctx, nomad, f.IO.Out, args[0], alloc, stream, follow)
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep streaming new lines")
	cmd.Flags().BoolVar(&stderr, "stderr", false, "show stderr instead of stdout")
	cmd.Flags().StringVar(&alloc, "alloc", "", "only the replica with this allocation `ID` (or prefix)")
	return cmd
}

func replicaLogs(ctx context.Context, nomad nomadapi.API, out io.Writer, name, allocPrefix, stream string, follow bool) error {
	stubs, _, err := nomad.JobAllocations(name, nil)
	if err != nil {
		return err
	}
	labels := map[uint64]string{}
	if vs, err := nomad.JobVersions(name); err == nil {
		for _, v := range vs {
			labels[deref(v.Version)] = v.Meta[contract.MetaVersion]
		}
	}
	var sel []*api.AllocationListStub
	for _, a := range stubs {
		if a.ClientStatus != api.AllocClientStatusRunning {
			continue
		}
		if allocPrefix != "" && !strings.HasPrefix(a.ID, allocPrefix) {
			continue
		}
		sel = append(sel, a)
	}
	if len(sel) == 0 {
		if allocPrefix != "" {
			return fmt.Errorf("service %s has no running replica with allocation ID %s…", name, allocPrefix)
		}
		return fmt.Errorf("service %s has no running replica", name)
	}
	sort.Slice(sel, func(i, j int) bool { return sel[i].Name < sel[j].Name })
	var mu sync.Mutex
	emit := func(prefix, line string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "%s%s\n", prefix, line)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(sel))
	for i, stub := range sel {
		prefix := fmt.Sprintf("[%s %s] ", stub.Name, firstOf(labels[stub.JobVersion], "?"))
		run := func() {
			errs[i] = streamReplica(ctx, nomad, stub.ID, stream, follow, func(l string) { emit(prefix, l) })
		}
		if follow {
			wg.Add(1)
			go func() { defer wg.Done(); run() }()
		} else {
			run()
		}
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("logs of %s: %w", gpujobs.ShortID(sel[i].ID), err)
		}
	}
	return nil
}

// streamReplica passes one replica's log to line, whole lines at a time.
func streamReplica(ctx context.Context, nomad nomadapi.API, allocID, stream string, follow bool, line func(string)) error {
	alloc, err := nomad.Allocation(allocID)
	if err != nil {
		return err
	}
	frames, errc := nomad.Logs(alloc, render.ServiceTask, stream, follow, ctx.Done())
	var buf bytes.Buffer
	flush := func(all bool) {
		for {
			i := bytes.IndexByte(buf.Bytes(), '\n')
			if i < 0 {
				break
			}
			line(string(buf.Next(i + 1)[:i]))
		}
		if all && buf.Len() > 0 {
			line(buf.String())
			buf.Reset()
		}
	}
	for {
		select {
		case <-ctx.Done():
			flush(true)
			return nil
		case fr, ok := <-frames:
			if !ok {
				flush(true)
				return nil
			}
			if fr != nil {
				buf.Write(fr.Data)
				flush(false)
			}
		case err, ok := <-errc:
			if ok && err != nil {
				flush(true)
				return err
			}
			if !ok {
				errc = nil
			}
		}
	}
}
