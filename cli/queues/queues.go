// Package queues is the CLI's side of gpujob's queues: it applies a queue
// file to the configuration in Consul (saying what changed), reads the
// configuration back for `gpujob queue list`, counts each queue's GPUs in
// the cluster's inventory for `gpujob queue status`, and checks a job
// against its queue at submit (CheckSubmit). The parsing is
// internal/queue/queuefile's, the store internal/queue/queuekv's, the
// rules internal/queue/policy's.
package queues

import (
	"fmt"
	"os"
	"os/user"
	"strings"
	"time"
	"unicode"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/queue/queuefile"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// Open is the queues' records in the factory's Consul, at
// contract.QueuePrefix. The prefix is fixed, not an environment setting:
// it is where the admission controller reads, and where ACLs keep every
// job's token from writing.
func Open(f *factory.Factory) (queuekv.Store, error) {
	c, err := f.Consul()
	if err != nil {
		return queuekv.Store{}, fmt.Errorf("queue configuration: %w", err)
	}
	return queuekv.New(c, queuekv.DefaultPrefix), nil
}

// Applied says where the configuration in Consul came from.
type Applied struct {
	File      string    `json:"file"`
	SHA256    string    `json:"sha256"`
	AppliedBy string    `json:"applied_by"`
	AppliedAt time.Time `json:"applied_at"`
	// Index is the Consul index it was written at.
	Index uint64 `json:"index"`
}

func appliedOf(r *queuekv.Record, index uint64) *Applied {
	if r == nil {
		return nil
	}
	return &Applied{File: r.File, SHA256: r.SHA256, AppliedBy: r.AppliedBy, AppliedAt: r.AppliedAt, Index: index}
}

// Line is "applied by alice@desk at 2026-12-02 12:00:00 UTC from
// queues.hcl (sha256 1a2b3c4d…)".
func (a *Applied) Line() string {
	return fmt.Sprintf("applied by %s at %s from %s (sha256 %s…)", a.AppliedBy, a.AppliedAt.UTC().Format("2006-01-02 15:04:05 MST"),
		a.File, a.SHA256[:min(12, len(a.SHA256))])
}

// DefaultQueue is the one queue of a cluster without a configuration:
// every job is in it, with no quota, weight 1 and the default priority —
// what `queue "default" {}` declares, so a file holding just that changes
// nothing. (policy.Config's implicit queue says borrow on; without a quota
// borrowing never applies, so the two are the same queue.)
var DefaultQueue = queuekv.Queue{Name: policy.DefaultQueue, Weight: queuefile.DefaultWeight, Priority: queuefile.DefaultPriority}

// Who names the person applying a file: user@host, from the system.
func Who() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		name += "@" + h
	}
	// Stored, then printed by others: nothing a terminal would act on.
	name = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(name, "?"))
	if len(name) > 200 {
		name = name[:200]
	}
	return name
}

// describe is a queue's settings in words: "gpus 8, weight 2, borrow on,
// priority 60, cohort research".
func describe(q queuekv.Queue) string {
	parts := []string{"gpus " + quota(q.GPUs), "weight " + fmt.Sprint(q.Weight), "borrow " + onOff(q.Borrow),
		"priority " + fmt.Sprint(q.Priority)}
	if q.Cohort != "" {
		parts = append(parts, "cohort "+q.Cohort)
	}
	return strings.Join(parts, ", ")
}

// quota shows a quota: "8", or "none" for 0.
func quota(gpus int) string {
	if gpus == 0 {
		return "none"
	}
	return fmt.Sprint(gpus)
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
