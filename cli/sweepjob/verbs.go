package sweepjob

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/cli/sweepcreds"
	"github.com/gpujob/gpujob/cli/sweepplot"
	"github.com/gpujob/gpujob/internal/safename"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// MaxTrials is `gpujob sweep extend --max-trials`: N more trials (Add) or
// N in all.
type MaxTrials struct {
	N   int
	Add bool
}

// ParseMaxTrials reads "+N" (N more) or "N" (N in all).
func ParseMaxTrials(s string) (MaxTrials, error) {
	add := strings.HasPrefix(s, "+")
	n, err := strconv.Atoi(strings.TrimPrefix(s, "+"))
	if err != nil || n < 0 {
		return MaxTrials{}, fmt.Errorf("--max-trials %q: want +N or N", s)
	}
	return MaxTrials{N: n, Add: add}, nil
}

// Of is the max_trials m asks for, of a sweep that allows current.
func (m MaxTrials) Of(current int) int {
	if m.Add {
		return current + m.N
	}
	return m.N
}

// Extend raises sweep name's max_trials in st as m says and, when the
// sweep had ended, marks it running again so a new controller resumes it
// from its recorded history. It refuses more trials than a sweep may hold
// and fewer than it has already.
func Extend(st *controller.State, name string, m MaxTrials) error {
	n := m.Of(st.MaxTrials)
	if n > spec.MaxTrials {
		return fmt.Errorf("--max-trials %d: a sweep holds at most %d trials", n, spec.MaxTrials)
	}
	if n < len(st.Trials) {
		return fmt.Errorf("sweep %s already has %d trials; --max-trials must be at least that", name, len(st.Trials))
	}
	st.MaxTrials = n
	if st.Status.Terminal() {
		st.Status, st.Reason, st.Ended, st.StopRequested = controller.StatusRunning, "", time.Time{}, false
	}
	return nil
}

// ControllerPlan is the plan a sweep's controller runs: the record's, or,
// for a record that fails its checks (Record.Verify), one that fails the
// sweep with the reason and runs nothing: a controller that exited instead
// would only be restarted by Nomad again and again. With credentials (a
// cluster with ACLs) the record must also be, byte for byte, what submit
// wrote, since anyone with KV write could have changed its template.
func ControllerPlan(rec *Record, ns, name, digest string, creds *sweepcreds.Credentials) (*controller.Plan, error) {
	var why error
	switch {
	case creds != nil && creds.RecordDigest == "":
		why = fmt.Errorf("the controller's variable %s holds no digest of the sweep's record (submitted by an older gpujob?), "+
			"so nothing vouches for its trial template", sweepcreds.VariablePath(controller.ControllerJobID(name)))
	case creds != nil:
		why = rec.Verify(ns, name, digest, creds.RecordDigest)
	default:
		why = rec.Verify(ns, name, digest, "")
	}
	if why != nil {
		return &controller.Plan{Namespace: ns, Sweep: name, MaxTrials: 1, Parallel: 1,
			Refused: fmt.Sprintf("the controller refused the sweep's record %s: %v; no trial of it is launched "+
				"(gpujob sweep stop --purge %s, then submit it again)", sweepkv.SpecKey(KeyPrefix(), ns, name), why, name)}, nil
	}
	return rec.Plan()
}

// ReadCurves reads every trial's points of sweep name's objective from
// its metrics record in Consul (prefix is the sweeps' KV prefix, ns the
// sweep's namespace), for `gpujob sweep report`.
func ReadCurves(ctx context.Context, c *consul.Client, prefix, ns, name string, rec *Record, st *controller.State) ([]sweepplot.Curve, error) {
	trials := sweepkv.SweepKey(prefix, ns, name) + "/trials/"
	pairs, _, err := c.KV().List(trials, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", trials, err)
	}
	metrics := map[string][]byte{}
	for _, p := range pairs {
		if id, ok := strings.CutPrefix(p.Key, trials); ok {
			if id, ok = strings.CutSuffix(id, "/metrics"); ok {
				metrics[id] = p.Value
			}
		}
	}
	return Curves(rec, st, metrics)
}

// Curves is each trial's curve of the objective: metrics holds the trials'
// metrics records by their key's trial segment (safename.Encode of the
// trial ID). The best trial is marked, and a trial stopped early carries a
// short note of who stopped it, for the legend.
func Curves(rec *Record, st *controller.State, metrics map[string][]byte) ([]sweepplot.Curve, error) {
	best := st.Best(rec.Maximize())
	var curves []sweepplot.Curve
	for _, t := range st.Trials {
		c := sweepplot.Curve{ID: t.ID, Label: t.ID + " " + t.Params.String(), State: string(t.State),
			Best: best != nil && best.ID == t.ID}
		if t.State == controller.TrialStopped {
			c.StopNote = StopNote(t)
		}
		if raw := metrics[safename.Encode(t.ID)]; raw != nil {
			var m sweepkv.Metrics
			if err := json.Unmarshal(raw, &m); err != nil {
				return nil, fmt.Errorf("reading the metrics of %s: %w", t.ID, err)
			}
			for _, p := range m.Points {
				if v, ok := p.Values[rec.Metric]; ok {
					c.Points = append(c.Points, sweepplot.Point{Step: p.Step, Value: v})
				}
			}
		}
		curves = append(curves, c)
	}
	return curves, nil
}

// StopNote shortens a stop reason for a legend: "ASHA at step 40".
func StopNote(t controller.Trial) string {
	r := strings.TrimPrefix(t.Reason, "stopped by ")
	if i := strings.Index(r, ":"); i > 0 {
		r = r[:i]
	}
	return r
}
