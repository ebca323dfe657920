package autoscale

import (
	"context"
	"time"

	"github.com/gpujob/gpujob/internal/backoff"
	consulapi "github.com/hashicorp/consul/api"
)

// watchWait is how long one blocking query waits for a change; the
// context ends it sooner.
const watchWait = 5 * time.Minute

// watchList calls deliver with every new content of the keys under prefix,
// from blocking queries, until ctx ends. On an error it calls failed, keeps
// what it delivered last and retries with backoff.
func watchList(ctx context.Context, client *consulapi.Client, prefix string, deliver func(consulapi.KVPairs), failed func(error)) {
	bo := backoff.New(backoffBase, backoffCap)
	var index uint64
	first := true
	for {
		pairs, meta, err := client.KV().List(prefix, (&consulapi.QueryOptions{WaitIndex: index, WaitTime: watchWait}).WithContext(ctx))
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failed(err)
			if !bo.Wait(ctx) {
				return
			}
			continue
		}
		bo.Reset()
		changed := first || meta.LastIndex != index
		first = false
		switch {
		case meta.LastIndex < index:
			// Consul's rule: an index that goes backwards (a restored
			// snapshot, a new cluster) starts the watch over.
			index = 0
		case meta.LastIndex == 0:
			// Never block on index 0, which returns at once.
			index = 1
		default:
			index = meta.LastIndex
		}
		if changed {
			deliver(pairs)
		}
	}
}
