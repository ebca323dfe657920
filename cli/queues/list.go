package queues

import (
	"context"
	"fmt"
	"io"

	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// List is the queue configuration in Consul (`gpujob queue list -json`).
type List struct {
	// Applied says where it came from; null when no queue file was
	// applied (then Queues is the default queue alone).
	Applied *Applied        `json:"applied"`
	Queues  []queuekv.Queue `json:"queues"`
	// Implicit is true when no queue is declared: Queues is the default
	// queue that exists then.
	Implicit bool `json:"implicit"`
}

// ReadList reads the configuration; an invalid stored one is an error.
func ReadList(ctx context.Context, store queuekv.Store) (*List, error) {
	r, index, err := store.Read(ctx)
	if err != nil {
		return nil, err
	}
	return listOf(r, index), nil
}

func listOf(r *queuekv.Record, index uint64) *List {
	l := &List{Applied: appliedOf(r, index), Queues: []queuekv.Queue{DefaultQueue}, Implicit: true}
	if r != nil && len(r.Queues) > 0 {
		l.Queues, l.Implicit = r.Queues, false
	}
	return l
}

// Print writes the list as a table, for people.
func (l *List) Print(w io.Writer) error {
	if l.Applied == nil {
		fmt.Fprintln(w, "No queue file applied: every job is in the default queue (gpujob queue apply FILE declares queues).")
	} else {
		fmt.Fprintf(w, "Queues %s.\n", l.Applied.Line())
		if l.Implicit {
			fmt.Fprintln(w, "The file declares no queue: every job is in the default queue.")
		}
	}
	fmt.Fprintln(w)
	t := gpujobs.NewTable(w, "QUEUE", "GPUS", "WEIGHT", "BORROW", "PRIORITY", "COHORT")
	for _, q := range l.Queues {
		t.Row(q.Name, quota(q.GPUs), fmt.Sprint(q.Weight), onOff(q.Borrow), fmt.Sprint(q.Priority), q.Cohort)
	}
	return t.Flush()
}
