package admit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/queue/queuefile"
)

// Format is the layout of the records this package writes and reads.
const Format = 1

// MaxRecordBytes bounds a stored record: Consul's own limit on a value.
const MaxRecordBytes = 512 << 10

// Bounds of a record's numbers and text.
const (
	MaxMembers  = 4096
	MaxGPUs     = 1024 // per member
	MaxCPUMHz   = 1 << 24
	MaxMemoryMB = 1 << 26
	maxTextLen  = 256
	// maxClockSkew is how far in the future a submitted_at may lie: more
	// would put a job behind everything for good, or (in the past, which
	// is not bounded) ahead of everything — which a submitter with write
	// on its namespace's records can do anyway only in its own namespace.
	maxClockSkew = 5 * time.Minute
)

// Kinds a JobRecord's Kind holds.
const (
	KindTrain   = "train"
	KindTrial   = "trial"
	KindService = "service"
)

// validID is a Nomad job ID the controller accepts from a record: one key
// segment, no escaping anywhere (Consul keys, Nomad URLs, logs).
var validID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// validNamespace is Nomad's rule for namespace names.
var validNamespace = regexp.MustCompile(`^[a-zA-Z0-9-]{1,128}$`)

// Resources is a member's needs as a record stores them.
type Resources struct {
	GPUs     int `json:"gpus"`
	CPUMHz   int `json:"cpu_mhz"`
	MemoryMB int `json:"memory_mb"`
}

// JobRecord is a queued job, at <jobs prefix>/<namespace>/<id>. Submit
// writes it; the controller never changes it (what it decides goes into
// the job's Status), so the job keeps its SubmittedAt — its place in the
// queue — across preemptions.
type JobRecord struct {
	Format    int    `json:"format"`
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Queue     string `json:"queue"`
	Kind      string `json:"kind"`
	// Priority 0 is the queue's.
	Priority  int       `json:"priority"`
	Members   int       `json:"members"`
	PerMember Resources `json:"per_member"`
	// MaxRuntimeS is the spec's max_runtime in seconds; 0 is unknown.
	MaxRuntimeS int64     `json:"max_runtime_s"`
	SubmittedAt time.Time `json:"submitted_at"`
	SubmittedBy string    `json:"submitted_by"`
	// Job is the rendered Nomad job, as the API's JSON.
	Job json.RawMessage `json:"job"`
}

// JobKey is a job record's key.
func JobKey(prefix, ns, id string) string { return prefix + "/" + ns + "/" + id }

// Name is "namespace/id", the job's name in the policy and in logs.
func (r *JobRecord) Name() string { return r.Namespace + "/" + r.ID }

// PolicyJob is the record as the policy sees it.
func (r *JobRecord) PolicyJob() policy.Job {
	kind := policy.KindTrain
	switch r.Kind {
	case KindTrial:
		kind = policy.KindTrial
	case KindService:
		kind = policy.KindService
	}
	return policy.Job{
		ID: r.Name(), Queue: r.Queue, Kind: kind, Priority: r.Priority, Members: r.Members,
		PerMember:   policy.Resources(r.PerMember),
		SubmittedAt: r.SubmittedAt, MaxRuntime: time.Duration(r.MaxRuntimeS) * time.Second,
	}
}

// Check reports a record that may not be believed, now being the
// controller's clock. It decodes the job too, and returns it.
func (r *JobRecord) Check(now time.Time) (*api.Job, error) {
	switch {
	case r.Format != Format:
		return nil, fmt.Errorf("format %d; this gpujob reads format %d", r.Format, Format)
	case !validID.MatchString(r.ID):
		return nil, fmt.Errorf("id %q: 1 to 128 letters, digits, '.', '-' and '_', starting with a letter or digit", clip(r.ID))
	case !validNamespace.MatchString(r.Namespace):
		return nil, fmt.Errorf("namespace %q is not a Nomad namespace name", clip(r.Namespace))
	case r.Kind != KindTrain && r.Kind != KindTrial && r.Kind != KindService:
		return nil, fmt.Errorf("kind %q: want train, trial or service", clip(r.Kind))
	case r.Priority != 0 && (r.Priority < queuefile.MinPriority || r.Priority > queuefile.MaxPriority):
		return nil, fmt.Errorf("priority %d: want %d to %d (0: the queue's)", r.Priority, queuefile.MinPriority, queuefile.MaxPriority)
	case r.Members < 1 || r.Members > MaxMembers:
		return nil, fmt.Errorf("members %d: want 1 to %d", r.Members, MaxMembers)
	case r.PerMember.GPUs < 0 || r.PerMember.GPUs > MaxGPUs:
		return nil, fmt.Errorf("per_member.gpus %d: want 0 to %d", r.PerMember.GPUs, MaxGPUs)
	case r.PerMember.CPUMHz < 0 || r.PerMember.CPUMHz > MaxCPUMHz:
		return nil, fmt.Errorf("per_member.cpu_mhz %d: want 0 to %d", r.PerMember.CPUMHz, MaxCPUMHz)
	case r.PerMember.MemoryMB < 0 || r.PerMember.MemoryMB > MaxMemoryMB:
		return nil, fmt.Errorf("per_member.memory_mb %d: want 0 to %d", r.PerMember.MemoryMB, MaxMemoryMB)
	case r.MaxRuntimeS < 0 || r.MaxRuntimeS > 366*24*3600:
		return nil, fmt.Errorf("max_runtime_s %d: want 0 to a year", r.MaxRuntimeS)
	case r.SubmittedAt.IsZero():
		return nil, errors.New("no submitted_at")
	case r.SubmittedAt.After(now.Add(maxClockSkew)):
		return nil, fmt.Errorf("submitted_at %s lies in the future", r.SubmittedAt.Format(time.RFC3339))
	}
	if r.Queue != "" {
		if err := queuefile.CheckName(r.Queue); err != nil {
			return nil, err
		}
	}
	if err := checkText(r.SubmittedBy); err != nil {
		return nil, fmt.Errorf("submitted_by: %w", err)
	}
	job, err := decodeJob(r.Job)
	if err != nil {
		return nil, err
	}
	if err := r.matches(job); err != nil {
		return nil, err
	}
	return job, nil
}

// decodeJob reads the record's job strictly: one JSON object of the API's
// fields, nothing after it.
func decodeJob(b []byte) (*api.Job, error) {
	if len(b) == 0 {
		return nil, errors.New("no job")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var job api.Job
	if err := dec.Decode(&job); err != nil {
		return nil, fmt.Errorf("job: not a Nomad job: %w", err)
	}
	if dec.More() {
		return nil, errors.New("job: more after the JSON object")
	}
	return &job, nil
}

// matches checks the job against what the record says of it: the policy
// counts the record's numbers, so a job asking for more than its record
// declares would slip past its queue's quota. The job is the truth; a
// record that disagrees is refused.
func (r *JobRecord) matches(job *api.Job) error {
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	if id := str(job.ID); id != r.ID {
		return fmt.Errorf("job ID %q differs from the record's %q", clip(id), r.ID)
	}
	ns := str(job.Namespace)
	if ns == "" {
		ns = "default"
	}
	// The controller registers with a token of its own: a record in one
	// namespace's tree must never start a job in another.
	if ns != r.Namespace {
		return fmt.Errorf("job namespace %q differs from the record's %q", clip(ns), r.Namespace)
	}
	if t := str(job.Type); t != "" && t != api.JobTypeBatch && t != api.JobTypeService {
		return fmt.Errorf("job type %q: a queued job is batch or service", clip(t))
	}
	if k := job.Meta[contract.MetaKind]; k != contract.KindTrain && k != contract.KindService {
		return fmt.Errorf("job meta %s = %q: not a gpujob train or service job", contract.MetaKind, clip(k))
	}
	q := job.Meta[contract.MetaQueue]
	if q == "" {
		q = policy.DefaultQueue
	}
	if want := orDefault(r.Queue, policy.DefaultQueue); q != want {
		return fmt.Errorf("job meta %s = %q differs from the record's queue %q", contract.MetaQueue, clip(q), want)
	}
	if _, ok := job.Meta[contract.MetaAdmission]; ok {
		return fmt.Errorf("job meta %s is the controller's to set", contract.MetaAdmission)
	}
	if err := checkAllowed(job); err != nil {
		return err
	}
	members, per, err := Gang(job, r.Kind == KindService)
	if err != nil {
		return err
	}
	if members != r.Members {
		return fmt.Errorf("job has %d members, the record says %d", members, r.Members)
	}
	if members > 0 && per != r.PerMember {
		return fmt.Errorf("a member asks for %s, the record says %s", describeRes(per), describeRes(r.PerMember))
	}
	return nil
}

// Gang is what a job asks of the cluster: its members (the groups'
// counts) and what each member asks for, every group alike. A job that
// scales itself (a scaling block) is refused unless service is set: a
// service's replicas move within the block's bounds, which must hold its
// count.
func Gang(job *api.Job, service bool) (members int, per Resources, err error) {
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	if len(job.TaskGroups) == 0 {
		return 0, per, errors.New("job has no task group")
	}
	seen := false
	for _, g := range job.TaskGroups {
		if g == nil {
			return 0, per, errors.New("a task group is null")
		}
		n := 1
		if g.Count != nil {
			n = *g.Count
		}
		if n < 0 || n > MaxMembers {
			return 0, per, fmt.Errorf("group %s: count %d", clip(str(g.Name)), n)
		}
		if s := g.Scaling; s != nil {
			if !service {
				return 0, per, fmt.Errorf("group %s: a queued job may not scale itself (scaling block)", clip(str(g.Name)))
			}
			if s.Max == nil || *s.Max < 0 || *s.Max > MaxMembers || (s.Min != nil && (*s.Min < 0 || *s.Min > int64(n))) || int64(n) > *s.Max {
				return 0, per, fmt.Errorf("group %s: scaling bounds must hold its count %d and stay within %d", clip(str(g.Name)), n, MaxMembers)
			}
		}
		if n == 0 {
			continue
		}
		members += n
		got := groupResources(g)
		if seen && per != got {
			return 0, per, fmt.Errorf("groups ask for different resources (%s and %s): a gang's members are alike", describeRes(per), describeRes(got))
		}
		per, seen = got, true
	}
	return members, per, nil
}

// groupResources is what one member of g asks for: the sum over its
// tasks of GPUs (devices of contract.GPUDevice's type), CPU and memory.
func groupResources(g *api.TaskGroup) Resources {
	var r Resources
	for _, t := range g.Tasks {
		if t == nil || t.Resources == nil {
			continue
		}
		if t.Resources.CPU != nil {
			r.CPUMHz += *t.Resources.CPU
		}
		if t.Resources.MemoryMB != nil {
			r.MemoryMB += *t.Resources.MemoryMB
		}
		for _, d := range t.Resources.Devices {
			if d == nil || !isGPU(d.Name) {
				continue
			}
			n := 1
			if d.Count != nil {
				n = int(*d.Count)
			}
			r.GPUs += n
		}
	}
	return r
}

// isGPU reports whether a device request asks for GPUs: "gpu",
// "<vendor>/gpu" or "<vendor>/gpu/<model>" (Nomad's device names).
func isGPU(name string) bool {
	parts := strings.Split(name, "/")
	switch len(parts) {
	case 1:
		return parts[0] == contract.GPUDeviceType
	case 2, 3:
		return parts[1] == contract.GPUDeviceType
	}
	return false
}

func describeRes(r Resources) string {
	return fmt.Sprintf("%d GPUs, %d MHz, %d MB", r.GPUs, r.CPUMHz, r.MemoryMB)
}

// EncodeJobRecord is the record's stored form; it refuses a record Check
// refuses.
func EncodeJobRecord(r *JobRecord, now time.Time) ([]byte, error) {
	if _, err := r.Check(now); err != nil {
		return nil, fmt.Errorf("queued job %s: %w", r.Name(), err)
	}
	return encode(r)
}

// DecodeJobRecord reads a stored job record strictly: at most
// MaxRecordBytes, one JSON object of exactly JobRecord's fields, values
// that pass Check. It returns the decoded Nomad job too.
func DecodeJobRecord(b []byte, now time.Time) (*JobRecord, *api.Job, error) {
	var r JobRecord
	if err := decodeStrict(b, &r); err != nil {
		return nil, nil, fmt.Errorf("not a queued job record: %w", err)
	}
	job, err := r.Check(now)
	if err != nil {
		return nil, nil, err
	}
	return &r, job, nil
}

// States a Status holds.
const (
	// StateQueued: waiting for admission (Position, Reason, EstimatedStart).
	StateQueued = "queued"
	// StateAdmitted: registered in Nomad at AdmittedAt.
	StateAdmitted = "admitted"
	// StatePreempted: being stopped (PreemptedBy, PreemptedWhy); queued
	// again, at its old place, once every member has stopped.
	StatePreempted = "preempted"
	// StateRefused: can never start as recorded (Reason).
	StateRefused = "refused"
)

// Placement is how many members went to a node.
type Placement struct {
	Node    string `json:"node"`
	Members int    `json:"members"`
}

// Status is what the controller says of a queued job, at <status
// prefix>/<namespace>/<id>. Only the controller's token writes there.
type Status struct {
	Format int    `json:"format"`
	State  string `json:"state"`
	// RecordIndex is the job record's Consul CreateIndex this status is
	// about: a record deleted and submitted again under the same ID is a
	// new job, whose old status does not apply.
	RecordIndex uint64 `json:"record_index"`
	// Admissions counts the job's registrations so far; the Nomad job's
	// MetaAdmission holds "<RecordIndex>.<Admissions>".
	Admissions int `json:"admissions"`
	// Admitting is the admission number being registered now (0: none):
	// written before the registration, so that the next leader checks
	// Nomad for it rather than registering again.
	Admitting int `json:"admitting,omitempty"`
	// Queued.
	Position       int        `json:"position,omitempty"`
	Reason         string     `json:"reason,omitempty"`
	EstimatedStart *time.Time `json:"estimated_start,omitempty"`
	// Nominated: victims were stopped for this job; it goes first.
	Nominated bool `json:"nominated,omitempty"`
	// Admitted.
	AdmittedAt *time.Time  `json:"admitted_at,omitempty"`
	Placement  []Placement `json:"placement,omitempty"`
	// ShortSince: the admitted gang has had fewer members placed or
	// running than it has (and not because they ended) since then; past
	// the controller's PartialGrace it is stopped whole and queued again.
	ShortSince *time.Time `json:"short_since,omitempty"`
	// Preempted (now, or last).
	PreemptedBy  string     `json:"preempted_by,omitempty"`
	PreemptedWhy string     `json:"preempted_why,omitempty"`
	PreemptedAt  *time.Time `json:"preempted_at,omitempty"`
	Preemptions  int        `json:"preemptions,omitempty"`
	// QueuedAt is when the job was queued again after its last
	// preemption (its wait since then; before any, its wait runs from the
	// record's submitted_at).
	QueuedAt *time.Time `json:"queued_at,omitempty"`
}

// Check reports a status that may not be believed.
func (s *Status) Check() error {
	switch {
	case s.Format != Format:
		return fmt.Errorf("format %d; this gpujob reads format %d", s.Format, Format)
	case s.State != StateQueued && s.State != StateAdmitted && s.State != StatePreempted && s.State != StateRefused:
		return fmt.Errorf("state %q", clip(s.State))
	case s.RecordIndex == 0:
		return errors.New("no record_index")
	case s.Admissions < 0 || s.Admitting < 0 || s.Preemptions < 0 || s.Position < 0:
		return errors.New("a negative count")
	case s.State == StateAdmitted && (s.AdmittedAt == nil || s.Admissions == 0):
		return errors.New("admitted without admitted_at or an admission")
	case len(s.Placement) > MaxMembers:
		return fmt.Errorf("%d placements", len(s.Placement))
	}
	for _, f := range []struct{ name, v string }{{"reason", s.Reason}, {"preempted_by", s.PreemptedBy}, {"preempted_why", s.PreemptedWhy}} {
		if err := checkLongText(f.v); err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
	}
	for _, p := range s.Placement {
		if err := checkText(p.Node); err != nil || p.Members < 1 {
			return fmt.Errorf("placement %q: %d members", clip(p.Node), p.Members)
		}
	}
	return nil
}

// Marker is the MetaAdmission value of the status's next admission
// (Admissions+1) or of admission n.
func Marker(recordIndex uint64, n int) string {
	return strconv.FormatUint(recordIndex, 10) + "." + strconv.Itoa(n)
}

// parseMarker reads a MetaAdmission value.
func parseMarker(s string) (recordIndex uint64, n int, ok bool) {
	a, b, found := strings.Cut(s, ".")
	if !found {
		return 0, 0, false
	}
	ri, err1 := strconv.ParseUint(a, 10, 64)
	k, err2 := strconv.Atoi(b)
	return ri, k, err1 == nil && err2 == nil && k > 0
}

// EncodeStatus is the status's stored form.
func EncodeStatus(s *Status) ([]byte, error) {
	if err := s.Check(); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	return encode(s)
}

// DecodeStatus reads a stored status as strictly as a job record.
func DecodeStatus(b []byte) (*Status, error) {
	var s Status
	if err := decodeStrict(b, &s); err != nil {
		return nil, fmt.Errorf("not a queue status record: %w", err)
	}
	if err := s.Check(); err != nil {
		return nil, err
	}
	return &s, nil
}

func encode(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxRecordBytes {
		return nil, fmt.Errorf("%d bytes encoded; Consul holds at most %d in one value", len(b), MaxRecordBytes)
	}
	return b, nil
}

func decodeStrict(b []byte, v any) error {
	if len(b) > MaxRecordBytes {
		return fmt.Errorf("%d bytes; a record is at most %d", len(b), MaxRecordBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more after the JSON object")
	}
	return nil
}

// checkText refuses control characters (terminal escapes), invalid UTF-8
// and long text.
func checkText(s string) error {
	return checkTextLen(s, maxTextLen)
}

// checkLongText is checkText for the sentences the controller writes.
func checkLongText(s string) error { return checkTextLen(s, 4*maxTextLen) }

func checkTextLen(s string, n int) error { return queuefile.CheckText(s, n) }

// clip shortens s for an error message (which quotes it with %q).
func clip(s string) string { return queuefile.Clip(s) }

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
