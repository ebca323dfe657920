package main

// The attack benchmark (-attack): does the gateway degrade instead of
// falling over? Legitimate clients send --legit-rps requests a second
// (open loop: each on time whatever the last one did) through the gateway,
// with their own token, while hostile ones, with a valid token too (the
// worst case: a tenant attacking its neighbours), keep --attack-uploads
// uploads of --attack-body bytes in flight, half of them trickling at
// 1 KiB/s and half at 128 KiB/s, each starting over at once (250 ms) when
// cut off or refused, and --attack-slowloris connections sending a header
// line every 2 s, for --attack-for. Each round runs an anchor (the same
// legitimate load, no attack) and the attack, in an order rotated by the
// round. Figures: the legitimate requests' success and p99, the gateway's
// peak RSS, and how long after the attack stops the legitimate p99 (of the
// requests from then on) is back under 1.5× the anchor's.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type attackOptions struct {
	legitRPS    int
	uploads     int
	body        int64
	slowloris   int
	attackFor   time.Duration
	before      time.Duration // legitimate load before the attack
	recovery    time.Duration // and after it
	anchorFor   time.Duration
	rssCapMiB   int
	recoverySLO time.Duration
}

// legitResult is one legitimate request.
type legitResult struct {
	start time.Time
	lat   time.Duration
	ok    bool
}

// attackRun is one arm's figures in one round.
type attackRun struct {
	Arm         string  `json:"arm"`
	Round       int     `json:"round"`
	Legit       int     `json:"legit_requests"`
	LegitOK     int     `json:"legit_ok"`
	SuccessPct  float64 `json:"legit_success_pct"`
	P50Ms       float64 `json:"legit_p50_ms"`
	P99Ms       float64 `json:"legit_p99_ms"`
	P99AttackMs float64 `json:"legit_p99_during_attack_ms,omitempty"`
	RSSStartMiB float64 `json:"gateway_rss_start_mib"`
	RSSPeakMiB  float64 `json:"gateway_rss_peak_mib"`
	RecoveryS   float64 `json:"recovery_s,omitempty"` // after the attack stops; -1: not within the window
	AttackConns int64   `json:"attack_connections,omitempty"`
	AttackBytes int64   `json:"attack_bytes_sent,omitempty"`
	Shed        string  `json:"gateway_shed,omitempty"` // its shed counters' increase
	NormalP99Ms float64 `json:"normal_p99_bound_ms,omitempty"`

	legit           []legitResult
	attackEnd, stop time.Time
}

// runAttackBench runs the rounds on a set-up env and prints the figures.
func (e *env) runAttackBench(ao attackOptions) error {
	var runs []attackRun
	for r := 0; r < e.o.rounds; r++ {
		order := []string{"anchor", "attack"}
		if r%2 == 1 {
			order = []string{"attack", "anchor"}
		}
		logf("round %d/%d: %s", r+1, e.o.rounds, strings.Join(order, ", "))
		got := map[string]*attackRun{}
		for _, arm := range order {
			res, err := e.attackArm(arm, ao)
			if err != nil {
				return err
			}
			res.Round = r + 1
			got[arm] = &res
		}
		// The attack's recovery is judged against this round's anchor,
		// whichever ran first.
		at := got["attack"]
		at.NormalP99Ms = 1.5 * got["anchor"].P99Ms
		at.RecoveryS = recovery(at.legit, at.attackEnd, at.stop, at.NormalP99Ms)
		for _, arm := range order {
			logf("  %s: %s", arm, got[arm].line())
			runs = append(runs, *got[arm])
		}
	}
	md, js := attackReport(runs, ao)
	fmt.Print(md)
	fmt.Println(js)
	if e.o.jsonPath != "" {
		return os.WriteFile(e.o.jsonPath, []byte(js+"\n"), 0o644)
	}
	return nil
}

func (r attackRun) line() string {
	s := fmt.Sprintf("%d/%d ok (%.2f%%), p50 %.1f ms, p99 %.1f ms, gateway RSS %.0f → %.0f MiB peak",
		r.LegitOK, r.Legit, r.SuccessPct, r.P50Ms, r.P99Ms, r.RSSStartMiB, r.RSSPeakMiB)
	if r.Arm == "attack" {
		s += fmt.Sprintf(", p99 under attack %.1f ms, recovered %.1f s after (bound %.1f ms), %d attack connections, %.0f MB sent, shed %s",
			r.P99AttackMs, r.RecoveryS, r.NormalP99Ms, r.AttackConns, float64(r.AttackBytes)/1e6, r.Shed)
	}
	return s
}

// attackArm runs the legitimate load, with the attack when arm is
// "attack", and measures it.
func (e *env) attackArm(arm string, ao attackOptions) (attackRun, error) {
	gwPid := e.childNamed("gateway").pid()
	res := attackRun{Arm: arm, RSSStartMiB: rssMiB(gwPid)}
	total := ao.anchorFor
	if arm == "attack" {
		total = ao.before + ao.attackFor + ao.recovery
	}
	shedBefore, _ := e.shedCounters()

	ctx, cancel := context.WithTimeout(context.Background(), total)
	defer cancel()
	var peak atomic.Int64
	rssDone := make(chan struct{})
	go func() {
		defer close(rssDone)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if v := int64(rssMiB(gwPid) * 1024); v > peak.Load() {
					peak.Store(v)
				}
			}
		}
	}()
	start := time.Now()
	var attackStart, attackEnd time.Time
	var conns, sent atomic.Int64
	var attackWG sync.WaitGroup
	if arm == "attack" {
		attackStart = start.Add(ao.before)
		attackEnd = attackStart.Add(ao.attackFor)
		actx, acancel := context.WithDeadline(context.Background(), attackEnd)
		defer acancel()
		attackWG.Add(1)
		go func() {
			defer attackWG.Done()
			select {
			case <-time.After(ao.before):
			case <-actx.Done():
				return
			}
			e.attack(actx, ao, &conns, &sent)
		}()
	}
	legit := e.legitLoad(ctx, ao.legitRPS)
	attackWG.Wait()
	<-rssDone

	res.RSSPeakMiB = float64(peak.Load()) / 1024
	res.AttackConns, res.AttackBytes = conns.Load(), sent.Load()
	res.Legit = len(legit)
	var lats []int64
	var during []int64
	for _, l := range legit {
		if l.ok {
			res.LegitOK++
			lats = append(lats, int64(l.lat))
			if arm == "attack" && !l.start.Before(attackStart) && l.start.Before(attackEnd) {
				during = append(during, int64(l.lat))
			}
		}
	}
	if res.Legit > 0 {
		res.SuccessPct = 100 * float64(res.LegitOK) / float64(res.Legit)
	}
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	sort.Slice(during, func(i, j int) bool { return during[i] < during[j] })
	res.P50Ms, res.P99Ms = nsToMs(percentile(lats, 0.50)), nsToMs(percentile(lats, 0.99))
	if arm == "attack" {
		res.P99AttackMs = nsToMs(percentile(during, 0.99))
		res.legit, res.attackEnd, res.stop = legit, attackEnd, start.Add(total)
	}
	if shedAfter, err := e.shedCounters(); err == nil {
		var parts []string
		for _, k := range []string{"inflight", "buffer", "slow_body"} {
			parts = append(parts, fmt.Sprintf("%s %d", k, shedAfter[k]-shedBefore[k]))
		}
		res.Shed = strings.Join(parts, ", ")
	}
	// Let the attack's connections drain before the next arm.
	time.Sleep(2 * time.Second)
	return res, nil
}

// recovery is how long after end the legitimate requests are back to
// normal: the first whole second t such that, of the requests started from
// end+t to stop, none failed and their p99 is under bound; -1 when there is
// none. At least 5 s of requests are judged (the window of a p99 like the
// anchor's, not one second's worst request); a window shorter than that
// never counts as recovered.
func recovery(legit []legitResult, end, stop time.Time, bound float64) float64 {
	const judged = 5 * time.Second
	for t := time.Duration(0); end.Add(t+judged).Compare(stop) <= 0; t += time.Second {
		from := end.Add(t)
		var lats []int64
		failed := false
		for _, l := range legit {
			if l.start.Before(from) || !l.start.Before(stop) {
				continue
			}
			if !l.ok {
				failed = true
				break
			}
			lats = append(lats, int64(l.lat))
		}
		if failed || len(lats) == 0 {
			continue
		}
		sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
		if nsToMs(percentile(lats, 0.99)) <= bound {
			return t.Seconds()
		}
	}
	return -1
}

// legitLoad sends rps requests a second until ctx ends, each on time.
func (e *env) legitLoad(ctx context.Context, rps int) []legitResult {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	var out []legitResult
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(rps))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return out
		case <-tick.C:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := legitResult{start: time.Now()}
			req, _ := http.NewRequest(http.MethodPost, "http://"+e.gwAddr+requestPath, strings.NewReader(requestBody))
			req.Header.Set("Authorization", "Bearer "+e.secret)
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				r.ok = err == nil && resp.StatusCode == http.StatusOK
			}
			r.lat = time.Since(r.start)
			mu.Lock()
			out = append(out, r)
			mu.Unlock()
		}()
	}
}

// attack runs the hostile clients until ctx ends and they have all gone.
func (e *env) attack(ctx context.Context, ao attackOptions, conns, sent *atomic.Int64) {
	var wg sync.WaitGroup
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n",
		requestPath, e.gwAddr, e.secret, ao.body)
	for i := 0; i < ao.uploads; i++ {
		rate := int64(1 << 10) // a trickle, under the gateway's minimum rate
		if i%2 == 0 {
			rate = 128 << 10 // slow, but over it
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				conns.Add(1)
				slowUpload(ctx, e.gwAddr, head, ao.body, rate, sent)
				sleepCtx(ctx, 250*time.Millisecond)
			}
		}()
	}
	for i := 0; i < ao.slowloris; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				conns.Add(1)
				slowloris(ctx, e.gwAddr)
				sleepCtx(ctx, 250*time.Millisecond)
			}
		}()
	}
	wg.Wait()
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// slowUpload sends one upload at rate bytes a second until the gateway
// answers or cuts it off, or ctx ends.
func slowUpload(ctx context.Context, addr, head string, size, rate int64, sent *atomic.Int64) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		_, _ = http.ReadResponse(bufio.NewReader(conn), nil)
		conn.Close()
	}()
	if _, err := io.WriteString(conn, head); err != nil {
		return
	}
	const piece = 4 << 10
	buf := make([]byte, piece)
	interval := time.Duration(float64(piece) / float64(rate) * float64(time.Second))
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for off := int64(0); off < size; off += piece {
		select {
		case <-answered:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		n, err := conn.Write(buf[:min(piece, size-off)])
		sent.Add(int64(n))
		if err != nil {
			return
		}
	}
	select {
	case <-answered:
	case <-ctx.Done():
	}
}

// slowloris opens a request and sends a header line every 2 s, never
// ending it, until the gateway closes the connection or ctx ends.
func slowloris(ctx context.Context, addr string) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_, _ = io.Copy(io.Discard, conn)
	}()
	if _, err := io.WriteString(conn, "GET "+requestPath+" HTTP/1.1\r\nHost: "+addr+"\r\n"); err != nil {
		return
	}
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-closed:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if _, err := io.WriteString(conn, "X-Slow-"+strconv.Itoa(i)+": 1\r\n"); err != nil {
			return
		}
	}
}

// rssMiB is a process's resident set in MiB.
func rssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return float64(kb) / 1024
		}
	}
	return 0
}

// shedCounters reads gpujob_gateway_shed_total by reason from the
// gateway's admin listener.
func (e *env) shedCounters() (map[string]int64, error) {
	resp, err := http.Get("http://" + e.gwAdmin + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, `gpujob_gateway_shed_total{reason="`)
		if !ok {
			continue
		}
		reason, val, _ := strings.Cut(rest, `"} `)
		v, _ := strconv.ParseFloat(strings.TrimSpace(val), 64)
		out[reason] = int64(v)
	}
	return out, nil
}

// attackReport is the markdown table and the JSON line of the runs.
func attackReport(runs []attackRun, ao attackOptions) (string, string) {
	byArm := func(arm string, f func(attackRun) float64) stat {
		var v []float64
		for _, r := range runs {
			if r.Arm == arm {
				v = append(v, f(r))
			}
		}
		return statOf(v)
	}
	type armStats struct {
		Success, P50, P99, P99Attack, RSSPeak, Recovery stat
	}
	sum := map[string]armStats{}
	for _, arm := range []string{"anchor", "attack"} {
		sum[arm] = armStats{
			Success:   byArm(arm, func(r attackRun) float64 { return r.SuccessPct }),
			P50:       byArm(arm, func(r attackRun) float64 { return r.P50Ms }),
			P99:       byArm(arm, func(r attackRun) float64 { return r.P99Ms }),
			P99Attack: byArm(arm, func(r attackRun) float64 { return r.P99AttackMs }),
			RSSPeak:   byArm(arm, func(r attackRun) float64 { return r.RSSPeakMiB }),
			Recovery:  byArm(arm, func(r attackRun) float64 { return r.RecoveryS }),
		}
	}
	a := sum["attack"]
	worstRecovery, worstSuccess, worstRSS := 0.0, 100.0, 0.0
	never := false // some run did not recover within its window
	for _, r := range runs {
		if r.Arm != "attack" {
			continue
		}
		never = never || r.RecoveryS < 0
		worstRecovery = max(worstRecovery, r.RecoveryS)
		worstSuccess = min(worstSuccess, r.SuccessPct)
		worstRSS = max(worstRSS, r.RSSPeakMiB)
	}
	recoveryValue := fmt.Sprintf("%.0f s worst", worstRecovery)
	if never {
		recoveryValue = fmt.Sprintf("not within the %s after it, in some run", ao.recovery)
	}
	targets := []target{
		{"legitimate success ≥ 99.9 % in every attack run", fmt.Sprintf("%.2f %% worst", worstSuccess), worstSuccess >= 99.9},
		{fmt.Sprintf("gateway RSS ≤ %d MiB in every run", ao.rssCapMiB), fmt.Sprintf("%.0f MiB worst", worstRSS), worstRSS <= float64(ao.rssCapMiB)},
		{fmt.Sprintf("p99 back under 1.5× the anchor's within %s of the attack's end", ao.recoverySLO),
			recoveryValue, !never && worstRecovery <= ao.recoverySLO.Seconds()},
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n| arm | legit success %% | legit p50 ms | legit p99 ms | p99 under attack ms | gateway RSS peak MiB | recovery s |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, arm := range []string{"anchor", "attack"} {
		s := sum[arm]
		rec, under := "", ""
		if arm == "attack" {
			rec, under = s.Recovery.fmt(0), s.P99Attack.fmt(1)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", arm, s.Success.fmt(2), s.P50.fmt(1), s.P99.fmt(1), under, s.RSSPeak.fmt(0), rec)
	}
	fmt.Fprintf(&b, "\nMedian (min–max) of %d rounds, anchor and attack interleaved (recovery -1: not within the window). Legitimate load %d req/s; attack: %d uploads of %d bytes (half at 1 KiB/s, half at 128 KiB/s) and %d slowloris connections for %s.\n\n",
		a.Success.N, ao.legitRPS, ao.uploads, ao.body, ao.slowloris, ao.attackFor)
	for _, t := range targets {
		mark := "met"
		if !t.Met {
			mark = "NOT MET"
		}
		fmt.Fprintf(&b, "- %s: %s (%s)\n", t.Name, t.Value, mark)
	}
	js, _ := json.Marshal(map[string]any{
		"config": map[string]any{"rounds": a.Success.N, "legit_rps": ao.legitRPS, "uploads": ao.uploads, "upload_bytes": ao.body,
			"slowloris": ao.slowloris, "attack_s": ao.attackFor.Seconds(), "cpus": onlineCPUs(), "go": runtime.Version(),
			"date": time.Now().UTC().Format(time.RFC3339)},
		"anchor": sum["anchor"], "attack": sum["attack"], "targets": targets, "runs": runs,
	})
	return b.String(), string(js)
}
