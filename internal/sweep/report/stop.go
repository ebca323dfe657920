package report

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/consul"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// Bounds of the stop watch.
const (
	// stopWaitTime is one blocking query's longest wait; Consul's own
	// default (5 min) is fine, it is named here to be explicit.
	stopWaitTime = 5 * time.Minute
	// minWatchGap spaces the blocking queries that come back at once (an
	// index that went backwards), as Consul advises for every watcher; a
	// stop is then seen at most this much later.
	minWatchGap = 100 * time.Millisecond
	// maxReasonLen bounds a stop reason, which becomes a task event's
	// message and a line on the task's stderr.
	maxReasonLen = 512
)

// WatchStop waits for the trial's stop request at key (sweepkv.StopKey),
// calls stop with it once, and returns; or returns when ctx ends first.
// It never polls at a fixed interval: it waits in blocking queries on the
// key, and a request is seen as soon as Consul has it. Consul errors are
// retried with backoff and logged (throttled) through logf (optional). A
// request that is there already is seen at once.
func WatchStop(ctx context.Context, client *api.Client, key string, logf func(string, ...any), stop func(sweepkv.StopRequest)) {
	_ = consul.Watch(ctx, consul.KeyQuery(client, key), consul.WatchOptions{
		WaitTime: stopWaitTime, MinGap: minWatchGap,
		BackoffBase: backoffBase, BackoffCap: backoffCap,
		Logf: logf, What: "watching the sweep's stop request " + key,
	}, func(pair *api.KVPair, _ uint64) error {
		if pair == nil {
			return nil
		}
		stop(decodeStop(pair))
		return consul.ErrStopWatch
	})
}

// ReadStop reads the trial's stop request at key now (one request); found
// is false when there is none.
func ReadStop(ctx context.Context, client *api.Client, key string) (req sweepkv.StopRequest, found bool, err error) {
	pair, _, err := client.KV().Get(key, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return sweepkv.StopRequest{}, false, fmt.Errorf("reading %s: %w", key, err)
	}
	if pair == nil {
		return sweepkv.StopRequest{}, false, nil
	}
	return decodeStop(pair), true, nil
}

// decodeStop reads a stop request. The key's presence is the request: a
// value that is not a StopRequest still stops the trial, and says so.
func decodeStop(pair *api.KVPair) sweepkv.StopRequest {
	var req sweepkv.StopRequest
	if err := json.Unmarshal(pair.Value, &req); err != nil {
		return sweepkv.StopRequest{Reason: fmt.Sprintf("stopped by the sweep (the request at %s does not decode: %v)", pair.Key, err)}
	}
	req.Reason = cleanReason(req.Reason)
	if req.Reason == "" {
		req.Reason = "stopped by the sweep"
	}
	return req
}

// cleanReason makes a reason one line of bounded length: it becomes the
// task event's message and the supervisor's line on stderr.
func cleanReason(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return ' '
		}
		return r
	}, s)
	s = strings.TrimSpace(s)
	if len(s) > maxReasonLen {
		cut := maxReasonLen
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
