package queues

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
	"unicode"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/admit"
	"github.com/gpujob/gpujob/internal/queue/policy"
)

// Records is the queued jobs' side of the queues' tree as a submitter
// sees it: the job records it writes (gpujob/queues/jobs/<ns>/<id>) and
// the statuses the admission controller writes about them
// (gpujob/queues/state/status/<ns>/<id>). A user's token needs
// consul-queue-submit for its namespace: write on its records, read on
// its statuses — nothing else of the tree is touched here.
type Records struct {
	Consul *consulapi.Client
	// Prefix is the queues' tree; contract.QueuePrefix when "". Tests set
	// their own.
	Prefix string
}

func (r Records) prefix() string {
	if r.Prefix == "" {
		return contract.QueuePrefix
	}
	return strings.TrimSuffix(r.Prefix, "/")
}

// JobsPrefix and StatusPrefix are the trees of the records and statuses.
func (r Records) JobsPrefix() string   { return r.prefix() + "/jobs" }
func (r Records) StatusPrefix() string { return r.prefix() + "/state/status" }

// Entry is a queued job: its record and what the controller says of it.
type Entry struct {
	Record *admit.JobRecord
	// RecordIndex is the record's Consul CreateIndex (the controller's
	// statuses name it), ModifyIndex the index a withdrawal checks.
	RecordIndex, ModifyIndex uint64
	// Status is the controller's, nil while it has not answered about
	// this record (or its answer is about an earlier record of the name).
	Status *admit.Status
	// Invalid says why the record could not be read (then Record holds
	// only its name); the controller refuses such a record too.
	Invalid string
}

// State is the entry's state in words: waiting (the controller has not
// answered yet), queued, admitted, preempted or refused.
func (e *Entry) State() string {
	switch {
	case e.Invalid != "":
		return admit.StateRefused
	case e.Status == nil:
		return StateWaiting
	}
	return e.Status.State
}

// StateWaiting is an entry the admission controller has not answered
// about yet.
const StateWaiting = "waiting"

// Info is a queued job's queue fields, as the -json output of submit,
// status, list and queue status carries them.
type Info struct {
	Queue string `json:"queue"`
	// State: waiting (no answer from the admission controller yet),
	// queued, admitted, preempted or refused.
	State string `json:"state"`
	// Position is its place among the jobs waiting (1: next).
	Position       int        `json:"position,omitempty"`
	Reason         string     `json:"reason,omitempty"`
	EstimatedStart *time.Time `json:"estimated_start,omitempty"`
	SubmittedAt    time.Time  `json:"submitted_at"`
	SubmittedBy    string     `json:"submitted_by"`
	Priority       int        `json:"priority,omitempty"`
	GPUs           int        `json:"gpus"`
	AdmittedAt     *time.Time `json:"admitted_at,omitempty"`
	Admissions     int        `json:"admissions,omitempty"`
	PreemptedBy    string     `json:"preempted_by,omitempty"`
	PreemptedWhy   string     `json:"preempted_why,omitempty"`
	PreemptedAt    *time.Time `json:"preempted_at,omitempty"`
	Preemptions    int        `json:"preemptions,omitempty"`
}

// Info is e's queue fields.
func (e *Entry) Info() *Info {
	rec := e.Record
	in := &Info{Queue: orDefault(rec.Queue), State: e.State(), SubmittedAt: rec.SubmittedAt, SubmittedBy: rec.SubmittedBy,
		Priority: rec.Priority, GPUs: rec.Members * rec.PerMember.GPUs}
	if e.Invalid != "" {
		in.Reason = "the queued job's record is invalid: " + e.Invalid
		return in
	}
	if s := e.Status; s != nil {
		in.Position, in.Reason, in.EstimatedStart = s.Position, s.Reason, s.EstimatedStart
		in.AdmittedAt, in.Admissions = s.AdmittedAt, s.Admissions
		in.PreemptedBy, in.PreemptedWhy, in.PreemptedAt, in.Preemptions = s.PreemptedBy, s.PreemptedWhy, s.PreemptedAt, s.Preemptions
		if s.State != admit.StateQueued && s.State != admit.StateRefused {
			in.Position, in.EstimatedStart = 0, nil
		}
	}
	return in
}

// Line is the entry in one sentence, now being the reader's clock:
// "queued in team-a (position 3): 2 jobs ahead; …, estimated start
// 12:30:00 UTC (in 5m0s)".
func (e *Entry) Line(now time.Time) string {
	in := e.Info()
	switch in.State {
	case StateWaiting:
		return fmt.Sprintf("queued in %s: waiting for the admission controller's first answer (submitted %s by %s)",
			in.Queue, in.SubmittedAt.UTC().Format(time.RFC3339), in.SubmittedBy)
	case admit.StateQueued:
		s := fmt.Sprintf("queued in %s (position %d)", in.Queue, in.Position)
		if in.Reason != "" {
			s += ": " + in.Reason
		}
		s += ", " + estimate(in.EstimatedStart, now)
		if in.Preemptions > 0 {
			s += fmt.Sprintf("; preempted %d time(s), last by %s: %s", in.Preemptions, in.PreemptedBy, in.PreemptedWhy)
		}
		return s
	case admit.StateAdmitted:
		s := fmt.Sprintf("admitted by queue %s", in.Queue)
		if in.AdmittedAt != nil {
			s += " at " + in.AdmittedAt.UTC().Format(time.RFC3339)
		}
		if in.Reason != "" {
			s += " (" + in.Reason + ")"
		}
		return s
	case admit.StatePreempted:
		return fmt.Sprintf("preempted by %s: %s; it stops and is queued again in %s at its old place", in.PreemptedBy, in.PreemptedWhy, in.Queue)
	}
	return fmt.Sprintf("refused by queue %s: %s (gpujob stop %s withdraws it)", in.Queue, in.Reason, e.Record.ID)
}

// estimate is "estimated start 12:30:00 UTC (in 5m0s)", or that none can
// be given.
func estimate(t *time.Time, now time.Time) string {
	if t == nil || t.IsZero() {
		return "no estimated start yet (running jobs without a max_runtime hold what it needs)"
	}
	d := t.Sub(now).Round(time.Second)
	if d <= 0 {
		return "estimated start " + t.UTC().Format("15:04:05 MST") + " (due now)"
	}
	return fmt.Sprintf("estimated start %s (in %s)", t.UTC().Format("15:04:05 MST"), d)
}

// AlreadyQueuedError is Enqueue's answer when a record of the job exists.
type AlreadyQueuedError struct{ Entry *Entry }

func (e *AlreadyQueuedError) Error() string {
	r := e.Entry.Record
	return fmt.Sprintf("job %s is already in queue %s (%s, submitted by %s at %s): withdraw or stop it first (gpujob stop %s), or rename the spec's job",
		r.ID, orDefault(r.Queue), e.Entry.State(), r.SubmittedBy, r.SubmittedAt.UTC().Format(time.RFC3339), r.ID)
}

// EnqueueOptions is a job to queue.
type EnqueueOptions struct {
	// Job is the rendered Nomad job, as it would be registered. Its
	// namespace is set to Namespace; its members and per-member resources
	// are counted from it (Gang), as the controller counts them.
	Job       *api.Job
	Namespace string
	// Queue is the job's queue ("" the default queue); the job's meta
	// names it already (the renderer puts it there).
	Queue string
	// Kind is admit.KindTrain or admit.KindService.
	Kind string
	// Priority is the spec's (1 to 100), 0 for the queue's.
	Priority    int
	MaxRuntime  time.Duration
	SubmittedBy string
	Now         time.Time
	// NoLiveJob says the caller found no live Nomad job of this ID (none,
	// or a dead one it purged): a record the controller admitted is then
	// of a job that has ended, which the controller had not forgotten
	// yet; Enqueue replaces it.
	NoLiveJob bool
}

// Record is the job record o describes.
func (o EnqueueOptions) Record() (*admit.JobRecord, error) {
	if o.Job == nil || o.Job.ID == nil {
		return nil, errors.New("no job to queue")
	}
	ns := o.Namespace
	if ns == "" {
		ns = "default"
	}
	job := *o.Job
	job.Namespace = &ns
	// Counted as the admission controller counts them: a record whose
	// numbers differ is refused.
	members, per, err := admit.Gang(&job, o.Kind == admit.KindService)
	if err != nil {
		return nil, err
	}
	if members == 0 {
		return nil, errors.New("the job has no members")
	}
	b, err := json.Marshal(&job)
	if err != nil {
		return nil, fmt.Errorf("encoding job %s: %w", *job.ID, err)
	}
	return &admit.JobRecord{Format: admit.Format, ID: *job.ID, Namespace: ns, Queue: orDefault(o.Queue), Kind: o.Kind,
		Priority: o.Priority, Members: members, PerMember: per, MaxRuntimeS: int64(o.MaxRuntime / time.Second),
		SubmittedAt: o.Now.UTC(), SubmittedBy: o.SubmittedBy, Job: b}, nil
}

// Enqueue writes o's job record, only if none of that job exists (a
// check-and-set at index 0): a record already there is an
// *AlreadyQueuedError and changes nothing. The record is checked as the
// controller checks it (admit.EncodeJobRecord) before it is written. It
// returns the stored entry (no status yet).
func (r Records) Enqueue(ctx context.Context, o EnqueueOptions) (*Entry, error) {
	rec, err := o.Record()
	if err != nil {
		return nil, err
	}
	b, err := admit.EncodeJobRecord(rec, o.Now)
	if err != nil {
		return nil, err
	}
	key := admit.JobKey(r.JobsPrefix(), rec.Namespace, rec.ID)
	var e *Entry
	for try := 0; ; try++ {
		ok, _, err := r.Consul.KV().CAS(&consulapi.KVPair{Key: key, Value: b}, (&consulapi.WriteOptions{}).WithContext(ctx))
		if err != nil {
			return nil, fmt.Errorf("writing the queued job %s/%s (%s; a token of gpujob acl policy consul-queue-submit --namespace %s writes it): %w",
				rec.Namespace, rec.ID, key, rec.Namespace, err)
		}
		if e, err = r.Get(ctx, rec.Namespace, rec.ID); err != nil {
			return nil, err
		}
		if ok {
			break
		}
		if e != nil && try == 0 && o.NoLiveJob && e.State() == admit.StateAdmitted {
			// An ended job's record: withdrawn, then this one written.
			if _, err := r.Withdraw(ctx, e); err != nil {
				return nil, err
			}
			continue
		}
		if e == nil {
			return nil, fmt.Errorf("job %s/%s: a record appeared and went while queueing it; submit again", rec.Namespace, rec.ID)
		}
		return nil, &AlreadyQueuedError{Entry: e}
	}
	if e == nil || e.Record == nil || !e.Record.SubmittedAt.Equal(rec.SubmittedAt) {
		return nil, fmt.Errorf("job %s/%s was withdrawn or replaced right after it was queued", rec.Namespace, rec.ID)
	}
	return e, nil
}

// Update replaces the record of e's job with o's, keeping its place (the
// record's Consul CreateIndex, hence the controller's status, and its
// submitted_at): a check-and-set on e's ModifyIndex, so an update never
// brings back a record withdrawn meanwhile.
func (r Records) Update(ctx context.Context, e *Entry, o EnqueueOptions) (*Entry, error) {
	o.Now = e.Record.SubmittedAt
	rec, err := o.Record()
	if err != nil {
		return nil, err
	}
	rec.SubmittedBy = e.Record.SubmittedBy
	b, err := admit.EncodeJobRecord(rec, e.Record.SubmittedAt)
	if err != nil {
		return nil, err
	}
	key := admit.JobKey(r.JobsPrefix(), rec.Namespace, rec.ID)
	ok, _, err := r.Consul.KV().CAS(&consulapi.KVPair{Key: key, Value: b, ModifyIndex: e.ModifyIndex}, (&consulapi.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("updating the queued job %s/%s: %w", rec.Namespace, rec.ID, err)
	}
	if !ok {
		return nil, fmt.Errorf("job %s/%s's queue record changed or was withdrawn meanwhile; try again", rec.Namespace, rec.ID)
	}
	return r.Get(ctx, rec.Namespace, rec.ID)
}

// Get reads one job's record and status; nil, nil when it has no record.
func (r Records) Get(ctx context.Context, ns, id string) (*Entry, error) {
	q := (&consulapi.QueryOptions{RequireConsistent: true}).WithContext(ctx)
	p, _, err := r.Consul.KV().Get(admit.JobKey(r.JobsPrefix(), ns, id), q)
	if err != nil {
		return nil, fmt.Errorf("reading the queued job %s/%s: %w", ns, id, err)
	}
	if p == nil {
		return nil, nil
	}
	sp, _, err := r.Consul.KV().Get(admit.JobKey(r.StatusPrefix(), ns, id), q)
	if err != nil {
		return nil, fmt.Errorf("reading the queue status of %s/%s: %w", ns, id, err)
	}
	return entryOf(ns, id, p, sp), nil
}

// entryOf decodes a record and its status. Whatever is stored is read
// as strictly as the controller reads it, and never believed otherwise.
func entryOf(ns, id string, p, sp *consulapi.KVPair) *Entry {
	e := &Entry{RecordIndex: p.CreateIndex, ModifyIndex: p.ModifyIndex}
	// A record is checked against a clock far ahead: its submitted_at is
	// the controller's concern, not the reader's.
	rec, _, err := admit.DecodeJobRecord(p.Value, time.Now().Add(time.Hour))
	if err != nil {
		e.Invalid = err.Error()
		e.Record = &admit.JobRecord{ID: id, Namespace: ns}
		return e
	}
	e.Record = rec
	if sp != nil {
		if st, err := admit.DecodeStatus(sp.Value); err == nil && st.RecordIndex == p.CreateIndex {
			e.Status = st
		}
	}
	return e
}

// List reads the queued jobs of namespace ns ("" every namespace the
// token may read: Consul leaves out of a listing the keys it may not),
// ordered by queue, then position, then submission.
func (r Records) List(ctx context.Context, ns string) ([]*Entry, error) {
	q := (&consulapi.QueryOptions{RequireConsistent: true}).WithContext(ctx)
	jp, sp := r.JobsPrefix()+"/", r.StatusPrefix()+"/"
	if ns != "" {
		jp, sp = jp+ns+"/", sp+ns+"/"
	}
	jobs, _, err := r.Consul.KV().List(jp, q)
	if err != nil {
		return nil, fmt.Errorf("reading the queued jobs (%s): %w", jp, err)
	}
	if len(jobs) == 0 {
		return nil, nil
	}
	statuses, _, err := r.Consul.KV().List(sp, q)
	if err != nil {
		return nil, fmt.Errorf("reading the queue statuses (%s): %w", sp, err)
	}
	byName := map[string]*consulapi.KVPair{}
	for _, s := range statuses {
		byName[strings.TrimPrefix(s.Key, r.StatusPrefix()+"/")] = s
	}
	var out []*Entry
	for _, p := range jobs {
		name := strings.TrimPrefix(p.Key, r.JobsPrefix()+"/")
		n, id, ok := strings.Cut(name, "/")
		if !ok || strings.Contains(id, "/") {
			continue // not a record's key; the controller ignores it too
		}
		out = append(out, entryOf(n, id, p, byName[name]))
	}
	sort.SliceStable(out, func(i, k int) bool {
		a, b := out[i], out[k]
		if qa, qb := orDefault(a.Record.Queue), orDefault(b.Record.Queue); qa != qb {
			return qa < qb
		}
		if pa, pb := position(a), position(b); pa != pb {
			return pa < pb
		}
		return a.Record.SubmittedAt.Before(b.Record.SubmittedAt)
	})
	return out, nil
}

// position orders entries: the waiting ones by their place, then the
// ones without a place.
func position(e *Entry) int {
	if e.Status != nil && e.Status.State == admit.StateQueued && e.Status.Position > 0 {
		return e.Status.Position
	}
	return 1 << 30
}

// Withdraw deletes e's record (a check-and-set on its ModifyIndex: a
// record resubmitted meanwhile stays), so that the controller neither
// admits the job nor, once admitted, requeues it; the controller deletes
// the job's status. It reports whether the record was still e's.
func (r Records) Withdraw(ctx context.Context, e *Entry) (bool, error) {
	key := admit.JobKey(r.JobsPrefix(), e.Record.Namespace, e.Record.ID)
	ok, _, err := r.Consul.KV().DeleteCAS(&consulapi.KVPair{Key: key, ModifyIndex: e.ModifyIndex}, (&consulapi.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("withdrawing the queued job %s (%s): %w", e.Record.Name(), key, err)
	}
	return ok, nil
}

// Watch blocks until the status of e's job changes after index (0: now),
// or wait passes, and returns the job re-read with the index to wait on
// next; a nil entry when its record is gone or was replaced by another
// submission (a new CreateIndex).
func (r Records) Watch(ctx context.Context, e *Entry, index uint64, wait time.Duration) (*Entry, uint64, error) {
	ns, id := e.Record.Namespace, e.Record.ID
	q := (&consulapi.QueryOptions{WaitIndex: index, WaitTime: wait}).WithContext(ctx)
	_, meta, err := r.Consul.KV().Get(admit.JobKey(r.StatusPrefix(), ns, id), q)
	if err != nil {
		return nil, index, fmt.Errorf("waiting for the queue status of %s/%s: %w", ns, id, err)
	}
	next := meta.LastIndex
	if next < index {
		next = 0 // Consul's index went back (a restored snapshot): start over
	}
	cur, err := r.Get(ctx, ns, id)
	if err != nil {
		return nil, next, err
	}
	if cur == nil || cur.RecordIndex != e.RecordIndex {
		return nil, next, nil
	}
	return cur, next, nil
}

// SubmittedBy names the submitter in a record: the Consul token's
// description when it has one (with ACLs, who the token was made for),
// else $USER, else the system's user@host.
func SubmittedBy(ctx context.Context, c *consulapi.Client) string {
	name := ""
	if c != nil {
		if tok, _, err := c.ACL().TokenReadSelf((&consulapi.QueryOptions{}).WithContext(ctx)); err == nil && tok != nil {
			name = tok.Description
		}
	}
	if name == "" {
		name = os.Getenv("USER")
	}
	if name == "" {
		return Who()
	}
	return clean(name)
}

// clean keeps stored text free of what a terminal would act on, and short.
func clean(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:200], "")
	}
	return s
}

func orDefault(q string) string {
	if q == "" {
		return policy.DefaultQueue
	}
	return q
}

// Namespace is the namespace a factory's commands act in ("default" when
// it names none).
func Namespace(ns func() string) string {
	if ns == nil || ns() == "" {
		return "default"
	}
	return ns()
}

// SpecPriority is a spec's priority as a queue record holds it: the
// spec's when it sets one other than the default (50), else 0 — the
// queue's default priority. (A spec that writes priority = 50 gets its
// queue's.)
func SpecPriority(p int) int {
	if p == spec.DefaultPriority {
		return 0
	}
	return p
}
