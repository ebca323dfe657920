package queues

import (
	"context"
	"fmt"
	"io"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/contract"
)

// Stop withdraws job id's queue record in the factory's namespace, if it
// has one, saying so on out: a queued job then never starts, and an
// admitted one is not requeued once stopped. It reports whether a record
// was withdrawn. Without a Consul there is no record to withdraw; one that
// cannot be read is an error, which a caller that found the job in Nomad
// may only warn about.
func Stop(ctx context.Context, f *factory.Factory, id string, out io.Writer) (bool, error) {
	r, ok := RecordsOf(f)
	if !ok {
		return false, nil
	}
	e, err := r.Get(ctx, Namespace(f.Namespace), id)
	if err != nil || e == nil {
		return false, err
	}
	return r.Cancel(ctx, e, out)
}

// Cancel withdraws e's record and says what that means for its state.
func (r Records) Cancel(ctx context.Context, e *Entry, out io.Writer) (bool, error) {
	ok, err := r.Withdraw(ctx, e)
	if err != nil {
		return false, err
	}
	if !ok {
		return false, fmt.Errorf("job %s's queue record changed while it was being withdrawn (submitted again?): stop it again", e.Record.ID)
	}
	in := e.Info()
	switch in.State {
	case StateWaiting, "queued", "refused":
		what := in.State
		if in.Position > 0 {
			what = fmt.Sprintf("%s at position %d", what, in.Position)
		}
		fmt.Fprintf(out, "Job %s withdrawn from queue %s (it was %s; nothing of it ran).\n", e.Record.ID, in.Queue, what)
	default:
		fmt.Fprintf(out, "Job %s's record in queue %s deleted: the queue does not start it again.\n", e.Record.ID, in.Queue)
	}
	return true, nil
}

// StopAdmittedMeanwhile deregisters job id if the admission controller
// registered it between the caller's look at Nomad and the withdrawal
// (a job bearing the controller's admission marker); the caller found no
// job before.
func StopAdmittedMeanwhile(nomad nomadapi.API, id string, out io.Writer) error {
	job, err := nomad.Job(id)
	if gpujobs.IsNotFound(err) || job == nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading job %s after withdrawing it: %w", id, err)
	}
	if _, ok := job.Meta[contract.MetaAdmission]; !ok {
		return nil
	}
	if _, err := nomad.Deregister(id, false); err != nil {
		return fmt.Errorf("job %s was admitted while it was withdrawn; stopping it: %w", id, err)
	}
	fmt.Fprintf(out, "Job %s was being admitted as it was withdrawn: stopped it in Nomad too.\n", id)
	return nil
}
