package servicedeploy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/render"
)

// LogsRequest is which replicas' logs to show.
type LogsRequest struct {
	Name string
	// AllocPrefix picks the replica whose allocation ID starts with it
	// ("" all running ones).
	AllocPrefix string
	// Stream is "stdout" or "stderr".
	Stream string
	// Follow streams every replica at once until ctx ends.
	Follow bool
}

// Logs writes the log of service req.Name's running replicas to out, each
// line prefixed "[<alloc name> <version>] " so interleaved lines say
// whose they are. Without Follow the replicas are read one after another,
// so each one's lines stay together.
func Logs(ctx context.Context, nomad nomadapi.API, out io.Writer, req LogsRequest) error {
	if _, err := Load(nomad, req.Name); err != nil {
		return err
	}
	stubs, _, err := nomad.JobAllocations(req.Name, nil)
	if err != nil {
		return err
	}
	labels := VersionLabels(nomad, req.Name)
	sel := runningReplicas(stubs, req.AllocPrefix)
	if len(sel) == 0 {
		if req.AllocPrefix != "" {
			return fmt.Errorf("service %s has no running replica with allocation ID %s…", req.Name, req.AllocPrefix)
		}
		return fmt.Errorf("service %s has no running replica", req.Name)
	}
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
			errs[i] = streamReplica(ctx, nomad, stub.ID, req.Stream, req.Follow, func(l string) { emit(prefix, l) })
		}
		if req.Follow {
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

// runningReplicas is the running allocations whose ID starts with
// allocPrefix, by name.
func runningReplicas(stubs []*api.AllocationListStub, allocPrefix string) []*api.AllocationListStub {
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
	sort.Slice(sel, func(i, j int) bool { return sel[i].Name < sel[j].Name })
	return sel
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
