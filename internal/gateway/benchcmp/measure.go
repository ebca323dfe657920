package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	consulapi "github.com/hashicorp/consul/api"
)

// armRun is one arm's measured window in one round.
type armRun struct {
	Arm      string `json:"arm"`
	Round    int    `json:"round"`
	Position int    `json:"position"` // 1 = measured first in its round
	Requests int    `json:"requests"` // 200s completed in the window
	Errors   int    `json:"errors"`   // anything else completed (or failed) in the window
	// RPS is Requests over the window.
	RPS    float64 `json:"rps"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	MeanMs float64 `json:"mean_ms"`
	// CPU per request (µs) of the proxy process (0 for direct), the load
	// generator and the backend process; MachineBusy is the whole machine's
	// busy fraction over the window (/proc/stat).
	ProxyCPUUsPerReq   float64 `json:"proxy_cpu_us_per_req"`
	LoadCPUUsPerReq    float64 `json:"load_cpu_us_per_req"`
	BackendCPUUsPerReq float64 `json:"backend_cpu_us_per_req"`
	MachineBusy        float64 `json:"machine_busy"`
	// OtherBusy is the part of MachineBusy not spent by the proxy, the
	// load generator or the replicas: Consul, the kernel's softirqs not
	// charged to them, and whatever else runs on the machine.
	OtherBusy float64 `json:"other_busy"`
	// The gateway's read and write system calls per request
	// (/proc/PID/io's syscr and syscw; Go's sockets use read and write,
	// HAProxy's recv and send, which those do not count: 0 for HAProxy).
	ProxyReadsPerReq  float64 `json:"proxy_reads_per_req,omitempty"`
	ProxyWritesPerReq float64 `json:"proxy_writes_per_req,omitempty"`
}

// cpuSnap is the CPU time of the processes an arm involves, and of the
// machine.
type cpuSnap struct {
	proxy, self, backend int64 // clock ticks
	busy, total          int64 // /proc/stat ticks
	syscr, syscw         int64 // the proxy's
}

func (e *env) snap(proxyPid int) cpuSnap {
	var s cpuSnap
	if proxyPid > 0 {
		s.proxy = procTicks(proxyPid)
		s.syscr, s.syscw = procIO(proxyPid)
	}
	s.self = procTicks(os.Getpid())
	if b := e.childNamed("backend"); b != nil {
		s.backend = procTicks(b.pid())
	}
	s.busy, s.total = machineTicks()
	return s
}

// clockTick is USER_HZ, 100 on every Linux architecture Go runs on here.
const clockTick = 10 * time.Millisecond

// procTicks is a process's user+system CPU time, all threads, in ticks.
func procTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st
}

// procIO is a process's read and write system calls so far.
func procIO(pid int) (syscr, syscw int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch k {
		case "syscr":
			syscr = n
		case "syscw":
			syscw = n
		}
	}
	return syscr, syscw
}

// machineTicks is the machine's busy and total CPU ticks (/proc/stat).
func machineTicks() (busy, total int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0
	}
	var idle int64
	for i, v := range f[1:] {
		if i >= 8 { // guest time is counted in user already
			break
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	return total - idle, total
}

// measureArm runs one arm: the workers connect and load for the warm-up,
// then the window is measured.
func (e *env) measureArm(arm string, round int) (armRun, error) {
	var addrOf func(i int) string
	proxyPid := 0
	switch arm {
	case armDirect:
		addrOf = func(i int) string { return e.backends[i%len(e.backends)] }
	case armGateway:
		addrOf = func(int) string { return e.gwAddr }
		proxyPid = e.childNamed("gateway").pid()
	case armHAProxy:
		addrOf = func(int) string { return e.haAddr }
		proxyPid = e.childNamed("haproxy").pid()
	case armGatewayAlt:
		addrOf = func(int) string { return e.altAddr }
		proxyPid = e.childNamed(armGatewayAlt).pid()
	}
	req := request("bench.local", e.secret)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan [][]sample, 1)
	go func() { done <- load(ctx, e.o.conns, addrOf, req) }()

	time.Sleep(e.o.warmup)
	var profErr error
	var profWG sync.WaitGroup
	if e.o.profileDir != "" && arm == armGateway {
		profWG.Add(1)
		go func() {
			defer profWG.Done()
			profErr = e.profile(context.Background(), round, e.o.duration)
		}()
	}
	wStart := time.Now()
	s0 := e.snap(proxyPid)
	time.Sleep(e.o.duration)
	wEnd := time.Now()
	s1 := e.snap(proxyPid)
	cancel()
	samples := <-done
	profWG.Wait()
	if profErr != nil {
		logf("profile of round %d: %v", round+1, profErr)
	}

	r := armRun{Arm: arm}
	var lats []int64
	var sum int64
	from, to := wStart.UnixNano(), wEnd.UnixNano()
	for _, ws := range samples {
		for _, s := range ws {
			if s.end < from || s.end > to {
				continue
			}
			if !s.ok {
				r.Errors++
				continue
			}
			lats = append(lats, s.lat)
			sum += s.lat
		}
	}
	r.Requests = len(lats)
	window := wEnd.Sub(wStart)
	r.RPS = float64(r.Requests) / window.Seconds()
	if r.Requests == 0 {
		return r, fmt.Errorf("no request succeeded in the window (%d errors)", r.Errors)
	}
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	r.P50Ms = nsToMs(percentile(lats, 0.50))
	r.P90Ms = nsToMs(percentile(lats, 0.90))
	r.P99Ms = nsToMs(percentile(lats, 0.99))
	r.MeanMs = nsToMs(sum / int64(len(lats)))
	perReq := func(ticks int64) float64 {
		return float64(ticks) * float64(clockTick/time.Microsecond) / float64(r.Requests)
	}
	if proxyPid > 0 {
		r.ProxyCPUUsPerReq = perReq(s1.proxy - s0.proxy)
		if arm != armHAProxy {
			r.ProxyReadsPerReq = float64(s1.syscr-s0.syscr) / float64(r.Requests)
			r.ProxyWritesPerReq = float64(s1.syscw-s0.syscw) / float64(r.Requests)
		}
	}
	r.LoadCPUUsPerReq = perReq(s1.self - s0.self)
	r.BackendCPUUsPerReq = perReq(s1.backend - s0.backend)
	if dt := s1.total - s0.total; dt > 0 {
		r.MachineBusy = float64(s1.busy-s0.busy) / float64(dt)
		ours := (s1.proxy - s0.proxy) + (s1.self - s0.self) + (s1.backend - s0.backend)
		r.OtherBusy = float64(s1.busy-s0.busy-ours) / float64(dt)
	}
	return r, nil
}

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []int64, p float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	k := int(float64(len(sorted))*p+0.999999999) - 1
	if k < 0 {
		k = 0
	}
	if k >= len(sorted) {
		k = len(sorted) - 1
	}
	return sorted[k]
}

func nsToMs(ns int64) float64 { return float64(ns) / 1e6 }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// poolRun is one flip of replica r2's check, down and back up. Every
// figure is from just before the agent call that changes the check; -1 when
// not seen.
type poolRun struct {
	// PoolDownMs: check critical -> the gateway's /metrics shows one
	// endpoint (the answer of the first scrape that does; scraped back to
	// back, each scrape taking about a millisecond).
	PoolDownMs float64 `json:"pool_down_ms"`
	// ScrapeDownMs and ScrapeUpMs are how long that scrape took: the pool
	// changed at most that long before PoolDownMs (PoolUpMs).
	ScrapeDownMs float64 `json:"scrape_down_ms"`
	ScrapeUpMs   float64 `json:"scrape_up_ms"`
	// LastToR2Ms: check critical -> the last request r2 received (after
	// which the gateway sent it none for a second). A lower bound of the
	// pool update: the closed loop sends in waves, with gaps of a few ms.
	LastToR2Ms float64 `json:"last_to_r2_ms"`
	// ConsulDownMs: check critical -> a blocking health query (passing
	// only) of an independent watcher in this process answering with one
	// replica.
	ConsulDownMs float64 `json:"consul_down_ms"`
	// PoolUpMs, FirstToR2Ms and ConsulUpMs: the same for the check passing
	// again (two endpoints; the first request r2 received).
	PoolUpMs    float64 `json:"pool_up_ms"`
	FirstToR2Ms float64 `json:"first_to_r2_ms"`
	ConsulUpMs  float64 `json:"consul_up_ms"`
}

type poolResult struct {
	Conns  int       `json:"conns"`
	Runs   []poolRun `json:"runs"`
	Errors int       `json:"errors"` // requests not answered 200 during the test
	OK     int       `json:"ok"`
}

// watchEvent is one answer of the independent health watch.
type watchEvent struct {
	at      int64 // unix nanoseconds
	passing int
}

// measurePool flips replica r2's TTL check to critical and back, under load
// through the gateway, and times when the gateway's pool changes (its
// /metrics), when r2 stops and starts receiving requests (as r2 sees them),
// and when Consul's blocking query answers an independent watcher.
func (e *env) measurePool() (*poolResult, error) {
	req := request("bench.local", e.secret)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan [][]sample, 1)
	go func() { done <- load(ctx, e.o.poolConns, func(int) string { return e.gwAddr }, req) }()

	var mu sync.Mutex
	var events []watchEvent
	go func() {
		// A watch of its own, as the gateway's pool (passing only, the tag).
		var index uint64
		for ctx.Err() == nil {
			q := (&consulapi.QueryOptions{WaitIndex: index, WaitTime: time.Minute}).WithContext(ctx)
			entries, meta, err := e.client.Health().Service(consulService, routeTag, true, q)
			now := time.Now().UnixNano()
			if err != nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			index = meta.LastIndex
			mu.Lock()
			events = append(events, watchEvent{at: now, passing: len(entries)})
			mu.Unlock()
		}
	}()
	firstEvent := func(after int64, passing int) float64 {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range events {
			if ev.at >= after && ev.passing == passing {
				return nsToMs(ev.at - after)
			}
		}
		return -1
	}
	// waitEndpoints scrapes the gateway's /metrics back to back until its
	// pool has n endpoints.
	metricsClient := &http.Client{Timeout: 5 * time.Second}
	waitEndpoints := func(t0 int64, n int) (at, scrape float64, err error) {
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			sent := time.Now().UnixNano()
			got, err := e.gatewayEndpoints(metricsClient)
			if err != nil {
				return 0, 0, err
			}
			if got == n {
				now := time.Now().UnixNano()
				return nsToMs(now - t0), nsToMs(now - sent), nil
			}
		}
		return 0, 0, fmt.Errorf("the gateway's pool does not have %d endpoints 15 s after the check changed", n)
	}

	agent := e.client.Agent()
	check := fmt.Sprintf(checkIDFmt, 2)
	res := &poolResult{Conns: e.o.poolConns}
	time.Sleep(time.Second)
	for rep := 0; rep < e.o.poolReps; rep++ {
		var pr poolRun
		if n, err := e.gatewayEndpoints(metricsClient); err != nil || n != 2 {
			return nil, fmt.Errorf("before flip %d: the gateway has %d endpoints (%v), want 2", rep+1, n, err)
		}
		a0, err := e.arrivals()
		if err != nil {
			return nil, err
		}
		if time.Since(time.Unix(0, a0.Last)) > 100*time.Millisecond {
			return nil, fmt.Errorf("r2 received nothing in the last 100 ms before the flip")
		}
		t0 := time.Now().UnixNano()
		if err := agent.UpdateTTL(check, "benchcmp: down", consulapi.HealthCritical); err != nil {
			return nil, err
		}
		if pr.PoolDownMs, pr.ScrapeDownMs, err = waitEndpoints(t0, 1); err != nil {
			return nil, err
		}
		// Wait until r2 has received nothing for a second.
		deadline := time.Now().Add(15 * time.Second)
		for {
			time.Sleep(5 * time.Millisecond)
			a, err := e.arrivals()
			if err != nil {
				return nil, err
			}
			if time.Since(time.Unix(0, a.Last)) > time.Second {
				pr.LastToR2Ms = nsToMs(a.Last - t0)
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("the gateway still sends requests to r2 15 s after its check went critical")
			}
		}
		pr.ConsulDownMs = firstEvent(t0, 1)

		if err := e.resetArrivals("r2"); err != nil {
			return nil, err
		}
		t1 := time.Now().UnixNano()
		if err := agent.UpdateTTL(check, "benchcmp: up", consulapi.HealthPassing); err != nil {
			return nil, err
		}
		if pr.PoolUpMs, pr.ScrapeUpMs, err = waitEndpoints(t1, 2); err != nil {
			return nil, err
		}
		deadline = time.Now().Add(15 * time.Second)
		for {
			a, err := e.arrivals()
			if err != nil {
				return nil, err
			}
			if a.FirstAfter != 0 {
				pr.FirstToR2Ms = nsToMs(a.FirstAfter - t1)
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("the gateway sends no request to r2 15 s after its check passed again")
			}
			time.Sleep(5 * time.Millisecond)
		}
		// Give the watcher its answer before reading it.
		time.Sleep(200 * time.Millisecond)
		pr.ConsulUpMs = firstEvent(t1, 2)
		logf("  flip %d: down: pool %.1f ms (scrape %.1f), last request to r2 %.1f ms, Consul %.1f ms; up: pool %.1f ms (scrape %.1f), first request to r2 %.1f ms, Consul %.1f ms",
			rep+1, pr.PoolDownMs, pr.ScrapeDownMs, pr.LastToR2Ms, pr.ConsulDownMs, pr.PoolUpMs, pr.ScrapeUpMs, pr.FirstToR2Ms, pr.ConsulUpMs)
		res.Runs = append(res.Runs, pr)
		time.Sleep(800 * time.Millisecond)
	}
	cancel()
	for _, ws := range <-done {
		for _, s := range ws {
			if s.ok {
				res.OK++
			} else {
				res.Errors++
			}
		}
	}
	return res, nil
}

// gatewayEndpoints is the sum of the gateway's gpujob_gateway_endpoints
// gauges (the benchmark routes one service).
func (e *env) gatewayEndpoints(c *http.Client) (int, error) {
	resp, err := c.Get("http://" + e.gwAdmin + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "gpujob_gateway_endpoints{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics line %q: %w", line, err)
		}
		n += int(v)
	}
	return n, nil
}

// arrivals is replica r2's record.
func (e *env) arrivals() (arrivals, error) {
	resp, err := http.Get("http://" + e.backCtl + "/arrivals")
	if err != nil {
		return arrivals{}, err
	}
	defer resp.Body.Close()
	var m map[string]arrivals
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		return arrivals{}, err
	}
	return m["r2"], nil
}

func (e *env) resetArrivals(name string) error {
	resp, err := http.Post("http://"+e.backCtl+"/reset?name="+name, "", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}
