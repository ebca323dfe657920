package autoscale

import (
	"context"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/consul"
)

// watchWait is how long one blocking query waits for a change; the
// context ends it sooner.
const watchWait = 5 * time.Minute

// watchList calls deliver with every new content of the keys under prefix,
// from blocking queries (consul.Watch), until ctx ends. Failed reads are
// logged as what (throttled) and retried with backoff, keeping what was
// delivered last; failing and recovered, when set, hear when reads start
// failing and when they work again.
func watchList(ctx context.Context, client *consulapi.Client, prefix string, logf func(string, ...any), what string,
	deliver func(consulapi.KVPairs), failing func(error), recovered func()) {
	opts := consul.WatchOptions{
		WaitTime: watchWait, BackoffBase: backoffBase, BackoffCap: backoffCap,
		Logf: logf, What: what,
	}
	if failing != nil {
		opts.OnFailing = func(err error, _ int) { failing(err) }
	}
	if recovered != nil {
		opts.OnRecovered = func(int) { recovered() }
	}
	_ = consul.Watch(ctx, consul.PrefixQuery(client, prefix), opts, func(pairs consulapi.KVPairs, _ uint64) error {
		deliver(pairs)
		return nil
	})
}
