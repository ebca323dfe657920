package main

import (
	"fmt"
	"sort"
	"strings"
)

type resultConfig struct {
	Rounds            int     `json:"rounds"`
	DurationS         float64 `json:"duration_s"`
	WarmupS           float64 `json:"warmup_s"`
	Conns             int     `json:"conns"`
	ServiceTimeMs     float64 `json:"service_time_ms"`
	Replicas          int     `json:"replicas"`
	CPUs              int     `json:"cpus"`
	GatewayGOMAXPROCS int     `json:"gateway_gomaxprocs"`
	HAProxyNbthread   int     `json:"haproxy_nbthread"`
	Pinned            string  `json:"pinned,omitempty"` // LOAD:PROXY CPUs
	HAProxyVersion    string  `json:"haproxy_version,omitempty"`
	HAProxySkipped    string  `json:"haproxy_skipped,omitempty"`
	AltGateway        string  `json:"alt_gateway,omitempty"`
	GoVersion         string  `json:"go_version"`
	Date              string  `json:"date"`
}

// stat is the median and range of one figure over rounds.
type stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

func statOf(v []float64) stat {
	if len(v) == 0 {
		return stat{}
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return stat{Median: med, Min: s[0], Max: s[n-1], N: n}
}

type armSummary struct {
	Arm        string `json:"arm"`
	RPS        stat   `json:"rps"`
	P50Ms      stat   `json:"p50_ms"`
	P99Ms      stat   `json:"p99_ms"`
	AddedP50Ms stat   `json:"added_p50_ms"` // over direct, same round
	AddedP99Ms stat   `json:"added_p99_ms"`
	ProxyCPU   stat   `json:"proxy_cpu_us_per_req"`
	LoadCPU    stat   `json:"load_cpu_us_per_req"`
	BackendCPU stat   `json:"backend_cpu_us_per_req"`
	Busy       stat   `json:"machine_busy"`
	OtherBusy  stat   `json:"other_busy"`
	Reads      stat   `json:"proxy_reads_per_req"`
	Writes     stat   `json:"proxy_writes_per_req"`
	Errors     int    `json:"errors"`
}

type target struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	Met   bool   `json:"met"`
}

type summary struct {
	Arms []armSummary `json:"arms"`
	// Per round: gateway / HAProxy throughput, gateway - HAProxy latency.
	GatewayOverHAProxyRPS  stat     `json:"gateway_over_haproxy_rps"`
	GatewayMinusHAProxyP50 stat     `json:"gateway_minus_haproxy_p50_ms"`
	GatewayMinusHAProxyP99 stat     `json:"gateway_minus_haproxy_p99_ms"`
	PoolDownMs             stat     `json:"pool_down_ms"`
	PoolLastToR2Ms         stat     `json:"pool_last_to_r2_ms"`
	PoolConsulDownMs       stat     `json:"pool_consul_down_ms"`
	PoolUpMs               stat     `json:"pool_up_ms"`
	PoolFirstToR2Ms        stat     `json:"pool_first_to_r2_ms"`
	PoolConsulUpMs         stat     `json:"pool_consul_up_ms"`
	PoolScrapeMs           stat     `json:"pool_scrape_ms"` // the deciding scrapes' durations, down and up
	Targets                []target `json:"targets"`
	// Quiet is the same over the rounds in which no window had
	// quietOther or more of the machine busy with other processes.
	Quiet *quietSummary `json:"quiet,omitempty"`
}

// quietOther is the busy share of the machine, outside the benchmark's
// processes, above which a round counts as disturbed.
const quietOther = 0.10

type quietSummary struct {
	Rounds                 []int `json:"rounds"`
	GatewayAddedP50Ms      stat  `json:"gateway_added_p50_ms"`
	HAProxyAddedP50Ms      stat  `json:"haproxy_added_p50_ms"`
	GatewayOverHAProxyRPS  stat  `json:"gateway_over_haproxy_rps"`
	GatewayMinusHAProxyP50 stat  `json:"gateway_minus_haproxy_p50_ms"`
}

type results struct {
	Config  resultConfig `json:"config"`
	Summary summary      `json:"summary"`
	Runs    []armRun     `json:"runs"`
	Pool    *poolResult  `json:"pool,omitempty"`
}

func (r *results) summarize() {
	byRound := map[int]map[string]armRun{}
	var arms []string
	for _, a := range r.Runs {
		if byRound[a.Round] == nil {
			byRound[a.Round] = map[string]armRun{}
		}
		byRound[a.Round][a.Arm] = a
		if !contains(arms, a.Arm) {
			arms = append(arms, a.Arm)
		}
	}
	order := []string{armDirect, armGateway, armHAProxy, armGatewayAlt}
	sort.SliceStable(arms, func(i, j int) bool { return rank(order, arms[i]) < rank(order, arms[j]) })
	rounds := make([]int, 0, len(byRound))
	for k := range byRound {
		rounds = append(rounds, k)
	}
	sort.Ints(rounds)
	col := func(arm string, f func(a, direct armRun) (float64, bool)) stat {
		var v []float64
		for _, k := range rounds {
			a, ok := byRound[k][arm]
			if !ok {
				continue
			}
			if x, ok := f(a, byRound[k][armDirect]); ok {
				v = append(v, x)
			}
		}
		return statOf(v)
	}
	r.Summary.Arms = nil
	for _, arm := range arms {
		s := armSummary{Arm: arm}
		s.RPS = col(arm, func(a, _ armRun) (float64, bool) { return a.RPS, true })
		s.P50Ms = col(arm, func(a, _ armRun) (float64, bool) { return a.P50Ms, true })
		s.P99Ms = col(arm, func(a, _ armRun) (float64, bool) { return a.P99Ms, true })
		s.AddedP50Ms = col(arm, func(a, d armRun) (float64, bool) { return a.P50Ms - d.P50Ms, d.Arm != "" })
		s.AddedP99Ms = col(arm, func(a, d armRun) (float64, bool) { return a.P99Ms - d.P99Ms, d.Arm != "" })
		s.ProxyCPU = col(arm, func(a, _ armRun) (float64, bool) { return a.ProxyCPUUsPerReq, true })
		s.LoadCPU = col(arm, func(a, _ armRun) (float64, bool) { return a.LoadCPUUsPerReq, true })
		s.BackendCPU = col(arm, func(a, _ armRun) (float64, bool) { return a.BackendCPUUsPerReq, true })
		s.Busy = col(arm, func(a, _ armRun) (float64, bool) { return a.MachineBusy, true })
		s.OtherBusy = col(arm, func(a, _ armRun) (float64, bool) { return a.OtherBusy, true })
		s.Reads = col(arm, func(a, _ armRun) (float64, bool) { return a.ProxyReadsPerReq, a.ProxyReadsPerReq > 0 })
		s.Writes = col(arm, func(a, _ armRun) (float64, bool) { return a.ProxyWritesPerReq, a.ProxyWritesPerReq > 0 })
		for _, k := range rounds {
			s.Errors += byRound[k][arm].Errors
		}
		r.Summary.Arms = append(r.Summary.Arms, s)
	}
	pair := func(f func(g, h armRun) float64) stat {
		var v []float64
		for _, k := range rounds {
			g, ok1 := byRound[k][armGateway]
			h, ok2 := byRound[k][armHAProxy]
			if ok1 && ok2 {
				v = append(v, f(g, h))
			}
		}
		return statOf(v)
	}
	r.Summary.GatewayOverHAProxyRPS = pair(func(g, h armRun) float64 { return g.RPS / h.RPS })
	r.Summary.GatewayMinusHAProxyP50 = pair(func(g, h armRun) float64 { return g.P50Ms - h.P50Ms })
	r.Summary.GatewayMinusHAProxyP99 = pair(func(g, h armRun) float64 { return g.P99Ms - h.P99Ms })

	q := &quietSummary{}
	var gwAdded, haAdded, ratio, minus []float64
	for _, k := range rounds {
		quiet := true
		for _, a := range byRound[k] {
			if a.OtherBusy >= quietOther {
				quiet = false
			}
		}
		if !quiet {
			continue
		}
		q.Rounds = append(q.Rounds, k)
		d, okD := byRound[k][armDirect]
		g, okG := byRound[k][armGateway]
		h, okH := byRound[k][armHAProxy]
		if okD && okG {
			gwAdded = append(gwAdded, g.P50Ms-d.P50Ms)
		}
		if okD && okH {
			haAdded = append(haAdded, h.P50Ms-d.P50Ms)
		}
		if okG && okH {
			ratio = append(ratio, g.RPS/h.RPS)
			minus = append(minus, g.P50Ms-h.P50Ms)
		}
	}
	q.GatewayAddedP50Ms, q.HAProxyAddedP50Ms = statOf(gwAdded), statOf(haAdded)
	q.GatewayOverHAProxyRPS, q.GatewayMinusHAProxyP50 = statOf(ratio), statOf(minus)
	r.Summary.Quiet = q
	if r.Pool != nil {
		var pd, lr, cd, pu, fr, cu, sc []float64
		for _, p := range r.Pool.Runs {
			sc = append(sc, p.ScrapeDownMs, p.ScrapeUpMs)
			pd, lr, pu, fr = append(pd, p.PoolDownMs), append(lr, p.LastToR2Ms), append(pu, p.PoolUpMs), append(fr, p.FirstToR2Ms)
			if p.ConsulDownMs >= 0 {
				cd = append(cd, p.ConsulDownMs)
			}
			if p.ConsulUpMs >= 0 {
				cu = append(cu, p.ConsulUpMs)
			}
		}
		r.Summary.PoolDownMs, r.Summary.PoolLastToR2Ms, r.Summary.PoolConsulDownMs = statOf(pd), statOf(lr), statOf(cd)
		r.Summary.PoolUpMs, r.Summary.PoolFirstToR2Ms, r.Summary.PoolConsulUpMs = statOf(pu), statOf(fr), statOf(cu)
		r.Summary.PoolScrapeMs = statOf(sc)
	}

	r.Summary.Targets = nil
	if s := r.Summary.GatewayOverHAProxyRPS; s.N > 0 {
		r.Summary.Targets = append(r.Summary.Targets, target{
			Name:  "gateway throughput >= 0.9x HAProxy's (median of per-round ratios)",
			Value: fmt.Sprintf("%.3f (%.3f-%.3f)", s.Median, s.Min, s.Max), Met: s.Median >= 0.9,
		})
	}
	for _, a := range r.Summary.Arms {
		if a.Arm == armGateway && a.AddedP50Ms.N > 0 {
			r.Summary.Targets = append(r.Summary.Targets, target{
				Name:  "gateway p50 <= direct + 1 ms (median of per-round differences)",
				Value: fmt.Sprintf("%+.2f ms (%+.2f to %+.2f)", a.AddedP50Ms.Median, a.AddedP50Ms.Min, a.AddedP50Ms.Max),
				Met:   a.AddedP50Ms.Median <= 1,
			})
		}
	}
	if s := r.Summary.PoolDownMs; s.N > 0 {
		r.Summary.Targets = append(r.Summary.Targets, target{
			Name:  "pool update after a replica turns unhealthy <= 1 s (median; every flip)",
			Value: fmt.Sprintf("%.1f ms (%.1f-%.1f)", s.Median, s.Min, s.Max), Met: s.Median <= 1000 && s.Max <= 1000,
		})
	}
}

func contains(s []string, x string) bool { return indexOf(s, x) >= 0 }

func indexOf(s []string, x string) int {
	for i, v := range s {
		if v == x {
			return i
		}
	}
	return -1
}

// rank orders x as in order, unknown names last.
func rank(order []string, x string) int {
	if i := indexOf(order, x); i >= 0 {
		return i
	}
	return len(order)
}

func (s stat) fmt(prec int) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, s.Median, prec, s.Min, prec, s.Max)
}

func (s stat) fmtSigned(prec int) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%+.*f (%+.*f to %+.*f)", prec, s.Median, prec, s.Min, prec, s.Max)
}

// markdown is the report: the arms' table, the pool test's and the targets.
func (r *results) markdown() string {
	var b strings.Builder
	c := r.Config
	pinned := "nothing pinned"
	if c.Pinned != "" {
		load, proxy, _ := strings.Cut(c.Pinned, ":")
		pinned = fmt.Sprintf("pinned: load generator, replicas and Consul on CPU %s, gateway and HAProxy on CPU %s", load, proxy)
	}
	fmt.Fprintf(&b, "\n%d rounds, %d connections, %.0f ms service time, %d replicas, %g s measured per arm after %g s warm-up; %d CPUs, %s (gateway GOMAXPROCS %d, HAProxy nbthread %d); %s\n\n",
		c.Rounds, c.Conns, c.ServiceTimeMs, c.Replicas, c.DurationS, c.WarmupS, c.CPUs, pinned, c.GatewayGOMAXPROCS, c.HAProxyNbthread, firstNonEmpty(c.HAProxyVersion, "HAProxy skipped: "+c.HAProxySkipped))
	b.WriteString("| arm | throughput (req/s) | p50 (ms) | p99 (ms) | p50 over direct (ms) | p99 over direct (ms) | proxy CPU (µs/req) | machine CPU busy | of it, not the benchmark's processes | errors |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, a := range r.Summary.Arms {
		added50, added99, proxy := a.AddedP50Ms.fmtSigned(2), a.AddedP99Ms.fmtSigned(2), a.ProxyCPU.fmt(1)
		if a.Arm == armDirect {
			added50, added99, proxy = "-", "-", "-"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", a.Arm, a.RPS.fmt(0), a.P50Ms.fmt(2), a.P99Ms.fmt(2),
			added50, added99, proxy, pct(a.Busy), pct(a.OtherBusy), a.Errors)
	}
	if s := r.Summary.GatewayOverHAProxyRPS; s.N > 0 {
		fmt.Fprintf(&b, "\ngateway / HAProxy throughput, per round: %s; gateway − HAProxy p50: %s ms, p99: %s ms\n",
			s.fmt(3), r.Summary.GatewayMinusHAProxyP50.fmtSigned(2), r.Summary.GatewayMinusHAProxyP99.fmtSigned(2))
	}
	if q := r.Summary.Quiet; q != nil {
		fmt.Fprintf(&b, "\nQuiet rounds (no window with %.0f %% or more of the machine busy outside the benchmark's processes): %d of %d", 100*quietOther, len(q.Rounds), r.Config.Rounds)
		if len(q.Rounds) > 0 {
			fmt.Fprintf(&b, " (%v); over them, p50 over direct: gateway %s ms, HAProxy %s ms; gateway / HAProxy throughput %s; gateway − HAProxy p50 %s ms",
				q.Rounds, q.GatewayAddedP50Ms.fmtSigned(2), q.HAProxyAddedP50Ms.fmtSigned(2), q.GatewayOverHAProxyRPS.fmt(3), q.GatewayMinusHAProxyP50.fmtSigned(2))
		}
		b.WriteString("\n")
	}
	b.WriteString("\nCPU per request (µs), load generator / backends: ")
	for i, a := range r.Summary.Arms {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s %.1f / %.1f", a.Arm, a.LoadCPU.Median, a.BackendCPU.Median)
	}
	b.WriteString("\n")
	for _, a := range r.Summary.Arms {
		if a.Writes.N > 0 {
			fmt.Fprintf(&b, "%s system calls per request (/proc/PID/io): read %.2f, write %.2f\n", a.Arm, a.Reads.Median, a.Writes.Median)
		}
	}
	if r.Pool != nil {
		fmt.Fprintf(&b, "\nPool update, replica r2's TTL check flipped under load (%d workers through the gateway), n=%d; %d requests, %d not 200:\n\n",
			r.Pool.Conns, len(r.Pool.Runs), r.Pool.OK+r.Pool.Errors, r.Pool.Errors)
		b.WriteString("| check changed → | the gateway's pool (its /metrics) | r2's last / first request | Consul's blocking query (independent watcher) |\n| --- | --- | --- | --- |\n")
		fmt.Fprintf(&b, "| critical: one endpoint, r2 gets no more requests | %s ms | %s ms | %s ms |\n",
			r.Summary.PoolDownMs.fmt(1), r.Summary.PoolLastToR2Ms.fmt(1), r.Summary.PoolConsulDownMs.fmt(1))
		fmt.Fprintf(&b, "| passing: two endpoints, r2 gets requests again | %s ms | %s ms | %s ms |\n",
			r.Summary.PoolUpMs.fmt(1), r.Summary.PoolFirstToR2Ms.fmt(1), r.Summary.PoolConsulUpMs.fmt(1))
		fmt.Fprintf(&b, "\nThe pool column is when the first /metrics scrape showing the change was answered (scraped back to back; the deciding scrapes took %s ms, so the pool changed up to that much earlier); r2's column is a lower bound when going down (requests come in waves).\n",
			r.Summary.PoolScrapeMs.fmt(1))
	}
	if len(r.Summary.Targets) > 0 {
		b.WriteString("\nTargets:\n")
		for _, t := range r.Summary.Targets {
			met := "met"
			if !t.Met {
				met = "NOT met"
			}
			fmt.Fprintf(&b, "- %s: %s — %s\n", t.Name, t.Value, met)
		}
	}
	return b.String()
}

func pct(s stat) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f %% (%.0f–%.0f)", 100*s.Median, 100*s.Min, 100*s.Max)
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
