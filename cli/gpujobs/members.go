package gpujobs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/contract"
)

const (
	// DefaultTask is a training job's member task when its meta names none.
	DefaultTask = "train"
)

// IsNotFound reports whether err is Nomad's 404.
func IsNotFound(err error) bool {
	if err == nil {
		return false
	}
	var ue api.UnexpectedResponseError
	if errors.As(err, &ue) && ue.StatusCode() == 404 {
		return true
	}
	var uep *api.UnexpectedResponseError
	if errors.As(err, &uep) && uep.StatusCode() == 404 {
		return true
	}
	return strings.Contains(err.Error(), "Unexpected response code: 404")
}

// IsTrainJob reports whether a job's meta marks it as a gpujob training job.
func IsTrainJob(meta map[string]string) bool { return meta[contract.MetaKind] == contract.KindTrain }

// LoadJob reads a training job: a missing job is `job "x" not found`, a job
// that gpujob did not render is refused with a pointer to `nomad`.
func LoadJob(nomad nomadapi.API, jobID string) (*api.Job, error) {
	job, err := nomad.Job(jobID)
	if IsNotFound(err) {
		return nil, fmt.Errorf("job %q not found", jobID)
	}
	if err != nil {
		return nil, err
	}
	if job == nil {
		return nil, fmt.Errorf("job %q not found", jobID)
	}
	if !IsTrainJob(job.Meta) {
		return nil, fmt.Errorf("job %q is not a gpujob training job (its meta has no %s = %q); use `nomad job status %s`",
			jobID, contract.MetaKind, contract.KindTrain, jobID)
	}
	return job, nil
}

// MetaInt reads an integer job meta value, -1 when absent or malformed.
func MetaInt(meta map[string]string, key string) int {
	n, err := strconv.Atoi(meta[key])
	if err != nil {
		return -1
	}
	return n
}

// TaskName is the job's member task, whose states, events and logs are the
// member's: the task the job meta gpujob_task names (every job gpujob
// renders has it; an image job's member is its docker task, next to a
// gpujob-driver sidecar), else, for a job rendered before that meta, the
// one with driver "gpujob", else "train".
func TaskName(job *api.Job) string {
	if job == nil {
		return DefaultTask
	}
	if name := job.Meta[contract.MetaTask]; name != "" && (len(job.TaskGroups) == 0 || hasTask(job, name)) {
		return name
	}
	for _, tg := range job.TaskGroups {
		for _, t := range tg.Tasks {
			if t != nil && t.Driver == contract.DriverName {
				return t.Name
			}
		}
	}
	return DefaultTask
}

func hasTask(job *api.Job, name string) bool {
	for _, tg := range job.TaskGroups {
		for _, t := range tg.Tasks {
			if t != nil && t.Name == name {
				return true
			}
		}
	}
	return false
}

// Member is one allocation of the training group: the current allocation
// of each name (bert.train[0], bert.train[1], …).
type Member struct {
	Stub *api.AllocationListStub
	// Alloc is the full allocation, set by Load (the logs and the GPUs
	// need it).
	Alloc    *api.Allocation
	Index    int // the [N] of the allocation's name, -1 if none
	Progress Progress
}

// ID is the allocation ID.
func (m *Member) ID() string { return m.Stub.ID }

// State is the member's state: pending, running, complete, failed or lost.
func (m *Member) State() string { return ClientState(m.Stub.ClientStatus) }

// Label names the member in log prefixes and notes: "rank 3", "ranks 4-7",
// or the allocation name before the member joined.
func (m *Member) Label() string {
	p := m.Progress
	switch {
	case !p.Joined:
		return m.Stub.Name
	case p.FirstRank == p.LastRank:
		return "rank " + strconv.Itoa(p.FirstRank)
	default:
		return "ranks " + p.RanksText()
	}
}

// ClientState maps Nomad's client status onto the states gpujob shows; a
// disconnected client's allocation ("unknown") shows as lost.
func ClientState(clientStatus string) string {
	switch clientStatus {
	case "pending", "running", "complete", "failed", "lost":
		return clientStatus
	case "unknown":
		return "lost"
	case "":
		return "pending"
	}
	return clientStatus
}

// Terminal reports whether a client status is final.
func Terminal(clientStatus string) bool {
	switch clientStatus {
	case "complete", "failed", "lost":
		return true
	}
	return false
}

// AllocIndex is N of "job.group[N]", -1 if the name has none.
func AllocIndex(name string) int {
	i := strings.LastIndexByte(name, '[')
	if i < 0 || !strings.HasSuffix(name, "]") {
		return -1
	}
	n, err := strconv.Atoi(name[i+1 : len(name)-1])
	if err != nil {
		return -1
	}
	return n
}

// Members lists a job's members: per allocation name the running (or
// pending) allocation, else the newest; names whose only allocations are
// terminal and of a job version older than the newest allocation's are left
// out. Sorted by the
// allocation index (the node rank, by the driver's rule).
func Members(nomad nomadapi.API, job *api.Job) ([]*Member, error) {
	stubs, _, err := nomad.JobAllocations(*job.ID, nil)
	if err != nil {
		return nil, err
	}
	version := uint64(0)
	if job.Version != nil {
		version = *job.Version
	}
	return SelectMembers(stubs, version, TaskName(job)), nil
}

// SelectMembers is Members on a list of allocations already read. version
// is the job's; a version no allocation has (stopping a job makes one) does
// not hide the allocations of the one before.
func SelectMembers(stubs []*api.AllocationListStub, version uint64, task string) []*Member {
	best := map[string]*api.AllocationListStub{}
	newest := uint64(0)
	for _, s := range stubs {
		if s != nil {
			newest = max(newest, s.JobVersion)
		}
	}
	version = min(version, newest)
	for _, s := range stubs {
		if s == nil {
			continue
		}
		cur, ok := best[s.Name]
		if !ok || better(s, cur) {
			best[s.Name] = s
		}
	}
	var out []*Member
	for _, s := range best {
		if Terminal(s.ClientStatus) && s.JobVersion < version {
			continue
		}
		m := &Member{Stub: s, Index: AllocIndex(s.Name)}
		if ts := s.TaskStates[task]; ts != nil {
			m.Progress = ParseEvents(ts.Events)
		} else {
			m.Progress = ParseEvents(nil)
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Index != b.Index {
			return a.Index < b.Index
		}
		return a.Stub.Name < b.Stub.Name
	})
	return out
}

// better prefers a live allocation, then the newer one.
func better(a, b *api.AllocationListStub) bool {
	if ta, tb := Terminal(a.ClientStatus), Terminal(b.ClientStatus); ta != tb {
		return !ta
	}
	if a.CreateIndex != b.CreateIndex {
		return a.CreateIndex > b.CreateIndex
	}
	return a.ID > b.ID
}

// Load reads the member's full allocation and refreshes its progress.
func (m *Member) Load(nomad nomadapi.API, task string) error {
	a, err := nomad.Allocation(m.Stub.ID)
	if err != nil {
		return err
	}
	m.Alloc = a
	if ts := a.TaskStates[task]; ts != nil {
		m.Progress = ParseEvents(ts.Events)
	}
	return nil
}

// Started reports whether the task has started (Nomad has logs for it).
func Started(states map[string]*api.TaskState, task string) bool {
	ts := states[task]
	return ts != nil && !ts.StartedAt.IsZero()
}

// GPU is one device reserved to a task.
type GPU struct {
	ID     string `json:"id"`
	Vendor string `json:"vendor"`
	Model  string `json:"model"`
}

// AllocGPUs is the GPUs Nomad reserved to the allocation's task.
func AllocGPUs(a *api.Allocation, task string) []GPU {
	if a == nil || a.AllocatedResources == nil {
		return nil
	}
	tr := a.AllocatedResources.Tasks[task]
	if tr == nil {
		return nil
	}
	var out []GPU
	for _, d := range tr.Devices {
		if d == nil || d.Type != "gpu" {
			continue
		}
		for _, id := range d.DeviceIDs {
			out = append(out, GPU{ID: id, Vendor: d.Vendor, Model: d.Name})
		}
	}
	return out
}

// GPUsText is "Tesla T4 ×2 (GPU-1a2b3c4d,GPU-5e6f7a8b)" with short IDs, or
// "-".
func GPUsText(gpus []GPU) string {
	if len(gpus) == 0 {
		return "-"
	}
	var models []string
	ids := map[string][]string{}
	for _, g := range gpus {
		if _, ok := ids[g.Model]; !ok {
			models = append(models, g.Model)
		}
		ids[g.Model] = append(ids[g.Model], ShortUUID(g.ID))
	}
	parts := make([]string, 0, len(models))
	for _, m := range models {
		parts = append(parts, fmt.Sprintf("%s ×%d (%s)", m, len(ids[m]), strings.Join(ids[m], ",")))
	}
	return strings.Join(parts, "; ")
}

// ReadLog reads a task's log to its current end (no follow) and returns at
// most the last maxBytes of it, starting at a line boundary when cut.
// (Nomad's API reads a log from its start; only the tail is kept.)
func ReadLog(ctx context.Context, nomad nomadapi.API, alloc *api.Allocation, task, stream string, maxBytes int) ([]byte, error) {
	var buf []byte
	cut := false
	err := StreamFrames(ctx, nomad, alloc, task, stream, false, func(data []byte) {
		buf = append(buf, data...)
		if maxBytes > 0 && len(buf) > 2*maxBytes {
			buf = slices.Clone(buf[len(buf)-maxBytes:])
			cut = true
		}
	})
	if maxBytes > 0 && len(buf) > maxBytes {
		buf = buf[len(buf)-maxBytes:]
		cut = true
	}
	if cut {
		if i := strings.IndexByte(string(buf), '\n'); i >= 0 {
			buf = buf[i+1:]
		}
	}
	return buf, err
}

// StreamLines reads a task's log line by line; with follow it keeps reading
// until the log ends (the task is dead), ctx ends, or an error.
func StreamLines(ctx context.Context, nomad nomadapi.API, alloc *api.Allocation, task, stream string, follow bool, emit func(line string)) error {
	var sp LineSplitter
	err := StreamFrames(ctx, nomad, alloc, task, stream, follow, func(data []byte) {
		for _, l := range sp.Write(data) {
			emit(l)
		}
	})
	if l, ok := sp.Flush(); ok {
		emit(l)
	}
	return err
}

// StreamFrames passes a task log's data to data as it arrives; without
// follow it ends at the log's current end. It ends early with ctx.Err().
func StreamFrames(ctx context.Context, nomad nomadapi.API, alloc *api.Allocation, task, stream string, follow bool, data func([]byte)) error {
	cancel := make(chan struct{})
	defer close(cancel)
	frames, errs := nomad.Logs(alloc, task, stream, follow, cancel)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err, ok := <-errs:
			if !ok {
				errs = nil // only frames tell the end now
				continue
			}
			if err != nil {
				return fmt.Errorf("reading the %s of %s (%s): %w", stream, alloc.Name, ShortID(alloc.ID), err)
			}
		case f, ok := <-frames:
			if !ok {
				return nil
			}
			if f != nil && len(f.Data) > 0 {
				data(f.Data)
			}
		}
	}
}
