package queues

import (
	"context"

	"github.com/gpujob/gpujob/cli/factory"
)

// RecordsOf is the queued jobs' records in the factory's Consul, or false
// when the factory has no Consul: a cluster without one has no queue.
func RecordsOf(f *factory.Factory) (Records, bool) {
	if f.Consul == nil {
		return Records{}, false
	}
	c, err := f.Consul()
	if err != nil || c == nil {
		return Records{}, false
	}
	return Records{Consul: c}, true
}

// Lookup is the queue entry of job id in the factory's namespace: nil
// when it has none, or when the queue records cannot be read (err says
// why; a caller that found the job in Nomad goes on without).
func Lookup(ctx context.Context, f *factory.Factory, id string) (*Entry, error) {
	r, ok := RecordsOf(f)
	if !ok {
		return nil, nil
	}
	return r.Get(ctx, Namespace(f.Namespace), id)
}
