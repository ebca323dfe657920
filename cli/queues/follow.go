package queues

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/gpujob/gpujob/internal/queue/admit"
)

// ErrWithdrawn is AwaitAdmission's answer when the job's record is gone
// (gpujob stop withdrew it) or another submission replaced it.
var ErrWithdrawn = errors.New("the job's queue record was withdrawn")

// RefusedError is AwaitAdmission's answer for a job the controller
// refused: it can never start as submitted.
type RefusedError struct{ Entry *Entry }

func (e *RefusedError) Error() string {
	return fmt.Sprintf("job %s: %s", e.Entry.Record.ID, e.Entry.Line(time.Now()))
}

// AwaitOptions is how AwaitAdmission reports progress.
type AwaitOptions struct {
	// Out gets one line per change of the job's queue status.
	Out io.Writer
	// TTY: Out is a terminal; while nothing changes a progress line
	// (time waited) is rewritten in place.
	TTY bool
	Now func() time.Time
	// Wait is the longest blocking query (default 5 minutes; 2 s on a
	// TTY, for the progress line).
	Wait time.Duration
}

// AwaitAdmission follows e's job with Consul blocking queries on its
// status until the controller admits it, printing each change of its
// place, reason or estimate ("queued in team-a (position 2): …"). It
// returns the admitted entry; a *RefusedError when the controller refuses
// the job, ErrWithdrawn when its record goes, ctx's error when ctx ends
// (the job stays queued).
func (r Records) AwaitAdmission(ctx context.Context, e *Entry, o AwaitOptions) (*Entry, error) {
	now := o.Now
	if now == nil {
		now = time.Now
	}
	wait := o.Wait
	if wait <= 0 {
		wait = 5 * time.Minute
		if o.TTY {
			wait = 2 * time.Second
		}
	}
	start := now()
	last := ""
	progress := false
	var index uint64
	cur := e
	for {
		switch cur.State() {
		case admit.StateAdmitted:
			if progress {
				fmt.Fprintln(o.Out)
			}
			fmt.Fprintln(o.Out, cur.Line(now()))
			return cur, nil
		case admit.StateRefused:
			if progress {
				fmt.Fprintln(o.Out)
			}
			return cur, &RefusedError{Entry: cur}
		}
		// What changed, not the estimate's countdown.
		in := cur.Info()
		key := fmt.Sprint(in.State, in.Position, in.Reason, in.EstimatedStart, in.PreemptedBy, in.Preemptions)
		if key != last {
			if progress {
				fmt.Fprintln(o.Out)
				progress = false
			}
			fmt.Fprintln(o.Out, cur.Line(now()))
			last = key
		} else if o.TTY {
			fmt.Fprintf(o.Out, "\r  waiting in queue %s: %s", in.Queue, now().Sub(start).Round(time.Second))
			progress = true
		}
		next, idx, err := r.Watch(ctx, cur, index, wait)
		if ctx.Err() != nil {
			if progress {
				fmt.Fprintln(o.Out)
			}
			return cur, ctx.Err()
		}
		if err != nil {
			return cur, err
		}
		if next == nil {
			if progress {
				fmt.Fprintln(o.Out)
			}
			return cur, ErrWithdrawn
		}
		cur, index = next, idx
	}
}
