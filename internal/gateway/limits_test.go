package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/servekv"
)

// rawConn dials the gateway's public listener.
func (h *harness) rawConn() net.Conn {
	h.t.Helper()
	u, _ := url.Parse(h.url)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

// readAnswer reads one response from conn within d; nil when the
// connection ended without one or nothing came.
func readAnswer(conn net.Conn, d time.Duration) *http.Response {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// closedBy reports whether the peer closed conn within d.
func closedBy(conn net.Conn, d time.Duration) bool {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, conn)
	ne, ok := err.(net.Error)
	return !(ok && ne.Timeout())
}

// Attack: a body that stops coming (after the headers and a few bytes),
// and one that trickles a byte every 100 ms (no pause long enough to time
// out, but far under the minimum rate), are answered 408 and cut off; a
// large body at a sane rate, taking longer than the grace, goes through.
func TestASlowBodyIsCutOffAndASaneOneIsNot(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) {
		c.BodyGrace = 300 * time.Millisecond
		c.BodyMinRate = 256 << 10
	})
	h.backend("m", "v1", func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, n)
	})
	h.route("m", servekv.Route{})
	h.waitRoute("m", "", "/m")
	h.waitEndpoints("m", 1)
	head := "POST /m HTTP/1.1\r\nHost: gw\r\nContent-Length: 100000\r\n\r\n"

	stalled := h.rawConn()
	start := time.Now()
	io.WriteString(stalled, head+"0123456789")
	resp := readAnswer(stalled, 5*time.Second)
	if resp == nil || resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("a stalled body: %v after %s, want 408", resp, time.Since(start))
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("a stalled body was cut off after %s, want about the 300 ms grace", el)
	}
	if !closedBy(stalled, 2*time.Second) {
		t.Error("the connection of a stalled body stayed open")
	}

	trickle := h.rawConn()
	start = time.Now()
	io.WriteString(trickle, head)
	done := make(chan *http.Response, 1)
	go func() { done <- readAnswer(trickle, 10*time.Second) }()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var got *http.Response
wait:
	for {
		select {
		case got = <-done:
			break wait
		case <-tick.C:
			if _, err := trickle.Write([]byte("x")); err != nil {
				got = <-done
				break wait
			}
		}
	}
	// Allowed: the 300 ms grace, then the next 64 KiB at 256 KiB/s.
	if got == nil || got.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("a trickled body: %v after %s, want 408", got, time.Since(start))
	}
	if el := time.Since(start); el < 400*time.Millisecond || el > 3*time.Second {
		t.Errorf("a trickled body was cut off after %s, want about 0.55 s", el)
	}

	// 1 MiB at 1 MiB/s (4× the minimum rate, 3× the grace): served.
	pr, pw := io.Pipe()
	go func() {
		chunk := bytes.Repeat([]byte("y"), 32<<10)
		for i := 0; i < 32; i++ {
			pw.Write(chunk)
			time.Sleep(time.Second / 32)
		}
		pw.Close()
	}()
	start = time.Now()
	res := h.do(http.MethodPost, "/m", pr)
	if res.code != 200 || res.body != strconv.Itoa(1<<20) {
		t.Errorf("1 MiB at 1 MiB/s: %d %q after %s", res.code, res.body, time.Since(start))
	}
	res = h.doAt(h.admin, http.MethodGet, MetricsPath, nil)
	if want := `gpujob_gateway_shed_total{reason="slow_body"} 2`; !strings.Contains(res.body, want+"\n") {
		t.Errorf("no %s in the metrics", want)
	}
}

// Attack: a slowloris (headers that never end) is cut off after the
// header timeout; a header flood is refused with 431.
func TestSlowHeadersAreCutOffAndFloodedOnesRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) {
		c.ReadHeaderTimeout = 300 * time.Millisecond
		c.MaxHeaderBytes = 4 << 10
	})
	conn := h.rawConn()
	start := time.Now()
	io.WriteString(conn, "GET /m HTTP/1.1\r\nHost: gw\r\n")
	go func() {
		for range 20 {
			time.Sleep(100 * time.Millisecond)
			if _, err := io.WriteString(conn, "X-Slow: 1\r\n"); err != nil {
				return
			}
		}
	}()
	if !closedBy(conn, 3*time.Second) {
		t.Fatal("a slowloris was not cut off within 3 s")
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("a slowloris was cut off after %s, want about the 300 ms header timeout", el)
	}

	flood := h.rawConn()
	var b strings.Builder
	b.WriteString("GET /m HTTP/1.1\r\nHost: gw\r\n")
	for b.Len() < 64<<10 {
		b.WriteString("X-Flood: " + strings.Repeat("z", 1000) + "\r\n")
	}
	b.WriteString("\r\n")
	io.WriteString(flood, b.String())
	if resp := readAnswer(flood, 5*time.Second); resp == nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("64 KiB of headers against a 4 KiB limit: %v, want 431", resp)
	}
}

// Attack: requests that hold the gateway (slow replicas, and requests held
// while a service has no replica) fill its --max-inflight: the next one is
// refused with 503 and Retry-After at once, and served again once they end.
func TestTheInflightCapShedsAndCountsHeldRequests(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.MaxInflight = 3 })
	release := make(chan struct{})
	h.backend("slow", "v1", func(w http.ResponseWriter, r *http.Request) {
		<-release
		fmt.Fprint(w, "slow")
	})
	h.route("slow", servekv.Route{})
	h.route("empty", servekv.Route{QueueTimeout: servekv.Duration(10 * time.Second)})
	h.waitRoute("slow", "", "/slow")
	h.waitRoute("empty", "", "/empty")
	h.waitEndpoints("slow", 1)
	h.eventually(5*time.Second, "the empty pool loaded", func() bool { return h.service("empty").pool.Load().snapshot().loaded })

	var wg sync.WaitGroup
	for _, path := range []string{"/slow", "/slow", "/empty"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.get(path)
		}()
	}
	h.eventually(5*time.Second, "3 requests in flight, 1 held", func() bool {
		return h.g.cap.inflight.Load() == 3 && h.g.Load().Queued["team-a/empty"] == 1
	})
	start := time.Now()
	res := h.get("/slow")
	if res.code != http.StatusServiceUnavailable || res.header.Get("Retry-After") == "" ||
		!strings.Contains(errorOf(t, res.body), "--max-inflight") {
		t.Errorf("over the cap: %d %s Retry-After %q", res.code, res.body, res.header.Get("Retry-After"))
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("shed after %s, not at once", el)
	}
	close(release)
	h.backend("empty", "v1", echo("empty"))
	wg.Wait()
	if res := h.get("/slow"); res.code != 200 {
		t.Errorf("after the load: %d %s", res.code, res.body)
	}
	res = h.doAt(h.admin, http.MethodGet, MetricsPath, nil)
	if want := `gpujob_gateway_shed_total{reason="inflight"} 1`; !strings.Contains(res.body, want+"\n") {
		t.Errorf("no %s in the metrics", want)
	}
}

// Attack: large uploads held (at a slow replica, or for want of one) fill
// the buffer cap: another large one is refused with 503 before its body is
// read, but a small request still has room; the route's own body limit
// holds, and the capacity comes back when they end.
func TestTheBufferCapShedsLargeBodiesAndKeepsRoomForSmallOnes(t *testing.T) {
	t.Parallel()
	const maxBuffered = 1 << 20 // 896 KiB for large bodies, 128 KiB kept for small ones
	h := newHarness(t, func(c *Config) { c.MaxBufferedBytes = maxBuffered })
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	h.backend("m", "v1", func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		if n > smallBodyBytes {
			<-release
		}
		fmt.Fprint(w, n)
	})
	t.Cleanup(free) // before the servers' cleanups, which wait for the held handlers
	h.route("m", servekv.Route{})
	h.route("tight", servekv.Route{ConsulService: h.consulService("m"), JobID: h.jobID("m"), Group: "serve", MaxBodyBytes: 100})
	h.waitRoute("m", "", "/m")
	h.waitRoute("tight", "", "/tight")
	h.waitEndpoints("m", 1)

	big := bytes.Repeat([]byte("b"), 400<<10)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res := h.do(http.MethodPost, "/m", bytes.NewReader(big)); res.code != 200 {
				t.Errorf("a held upload: %d %s", res.code, res.body)
			}
		}()
	}
	h.eventually(5*time.Second, "800 KiB buffered", func() bool { return h.g.cap.buffered.Load() == 800<<10 })
	// A third: refused with 503 before its body is read. The gateway then
	// closes the connection, so a client still writing its body may see
	// the reset rather than the answer; the shed counter says which.
	shed := func() string {
		res := h.doAt(h.admin, http.MethodGet, MetricsPath, nil)
		for _, line := range strings.Split(res.body, "\n") {
			if v, ok := strings.CutPrefix(line, `gpujob_gateway_shed_total{reason="buffer"} `); ok {
				return v
			}
		}
		return ""
	}
	res, err := h.attempt(http.MethodPost, "/m", bytes.NewReader(big))
	if err == nil && (res.code != http.StatusServiceUnavailable || res.header.Get("Retry-After") == "" ||
		!strings.Contains(errorOf(t, res.body), "--max-buffered")) {
		t.Errorf("a third 400 KiB upload: %d %s, want 503 with Retry-After", res.code, res.body)
	}
	// Chunked (no Content-Length): refused once past the room left.
	res, err = h.attempt(http.MethodPost, "/m", io.MultiReader(bytes.NewReader(big)))
	if err == nil && res.code != http.StatusServiceUnavailable {
		t.Errorf("a third 400 KiB chunked upload: %d %s, want 503", res.code, res.body)
	}
	if n := shed(); n != "2" {
		t.Errorf("%s uploads shed for want of buffers, want 2", n)
	}
	small := bytes.Repeat([]byte("s"), 32<<10)
	if res := h.do(http.MethodPost, "/m", bytes.NewReader(small)); res.code != 200 || res.body != strconv.Itoa(len(small)) {
		t.Errorf("a small request beside them: %d %s", res.code, res.body)
	}
	if res := h.do(http.MethodPost, "/tight", strings.NewReader(strings.Repeat("t", 101))); res.code != http.StatusRequestEntityTooLarge {
		t.Errorf("101 bytes on a route of max_body_bytes 100: %d", res.code)
	}
	// Larger than anything the gateway could buffer: 413, not a 503
	// that no retry could ever pass.
	if res, err := h.attempt(http.MethodPost, "/m", bytes.NewReader(make([]byte, maxBuffered))); err == nil && res.code != http.StatusRequestEntityTooLarge {
		t.Errorf("a body of all the buffer: %d", res.code)
	}
	free()
	wg.Wait()
	h.eventually(5*time.Second, "the buffers released", func() bool { return h.g.cap.buffered.Load() == 0 })
	if res := h.do(http.MethodPost, "/m", bytes.NewReader(big)); res.code != 200 {
		t.Errorf("after the load: %d %s", res.code, res.body)
	}
}

// Attack: a client that reads nothing of a large answer cannot hold its
// request slot for ever: it is cut off after the write idle timeout.
func TestASlowReaderIsCutOff(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.WriteIdleTimeout = 300 * time.Millisecond })
	big := bytes.Repeat([]byte("r"), 32<<20)
	h.backend("m", "v1", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(big)))
		w.Write(big)
	})
	h.route("m", servekv.Route{})
	h.waitRoute("m", "", "/m")
	h.waitEndpoints("m", 1)
	conn := h.rawConn()
	io.WriteString(conn, "GET /m HTTP/1.1\r\nHost: gw\r\n\r\n")
	h.eventually(5*time.Second, "the request in flight", func() bool { return h.g.cap.inflight.Load() == 1 })
	// Read nothing: the socket buffers fill and the gateway's writes block.
	h.eventually(10*time.Second, "the slow reader cut off", func() bool { return h.g.cap.inflight.Load() == 0 })
}

// The limiter table holds at most its maximum: a flood of new client
// addresses shares an overflow bucket, and buckets that have refilled are
// dropped to make room.
func TestTheLimiterTableIsBounded(t *testing.T) {
	s := newLimiterSet(10)
	l := servekv.Limit{RPS: 1, Burst: 1}
	start := time.Unix(1_000_000, 0)
	for i := range 10 {
		if ok, _ := s.allow("ip|svc|10.0.0."+strconv.Itoa(i), "ip|svc", l, start); !ok {
			t.Fatalf("client %d's first request refused", i)
		}
	}
	// 1000 more addresses at once: the table stays at 10 plus the
	// overflow bucket, which lets one through (its burst).
	passed := 0
	for i := range 1000 {
		if ok, _ := s.allow("ip|svc|10.1."+strconv.Itoa(i/250)+"."+strconv.Itoa(i%250), "ip|svc", l, start); ok {
			passed++
		}
	}
	if n := s.size(); n > 11 {
		t.Errorf("%d buckets after 1010 addresses, want at most 11", n)
	}
	if passed != 1 {
		t.Errorf("%d of 1000 newcomers passed through the shared bucket, want 1", passed)
	}
	// A known client keeps its own bucket.
	if ok, _ := s.allow("ip|svc|10.0.0.1", "ip|svc", l, start.Add(time.Second)); !ok {
		t.Error("a known client lost its bucket")
	}
	// Seconds later the buckets have refilled: a new address gets its own.
	if ok, _ := s.allow("ip|svc|10.2.0.1", "ip|svc", l, start.Add(5*time.Second)); !ok {
		t.Error("a new client after the buckets refilled was refused")
	}
	if s.m["ip|svc|10.2.0.1"] == nil {
		t.Error("a new client after the buckets refilled got no bucket of its own")
	}
}

func TestClientNetGroupsIPv6By64(t *testing.T) {
	for addr, want := range map[string]string{
		"10.1.2.3:5000":              "10.1.2.3",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:443": "2001:db8:1:2::/64",
		"[::ffff:10.1.2.3]:80":       "10.1.2.3",
	} {
		r := &http.Request{RemoteAddr: addr}
		if got := clientNet(r); got != want {
			t.Errorf("clientNet(%s) = %s, want %s", addr, got, want)
		}
	}
}

func TestTheAdminListenerAsksForItsToken(t *testing.T) {
	g, err := New(Config{Consul: mustClient(t), Nomad: newFakeNomad()})
	if err != nil {
		t.Fatal(err)
	}
	admin := g.AdminHandler("s3cret")
	for _, c := range []struct {
		auth string
		want int
	}{{"", 401}, {"Bearer wrong", 401}, {"Basic s3cret", 401}, {"Bearer s3cret", 200}} {
		req, _ := http.NewRequest(http.MethodGet, MetricsPath, nil)
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		w := &recorder{header: http.Header{}}
		admin.ServeHTTP(w, req)
		if w.code != c.want {
			t.Errorf("Authorization %q: %d, want %d", c.auth, w.code, c.want)
		}
	}
}

// recorder is a minimal ResponseWriter.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = 200
	}
	return r.body.Write(b)
}
func (r *recorder) WriteHeader(code int) { r.code = code }

// A request held for want of a replica keeps its body, and its body counts
// in the gateway's buffers until it is answered.
func TestAHeldRequestsBodyCountsInTheBuffers(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.route("empty", servekv.Route{QueueTimeout: servekv.Duration(600 * time.Millisecond)})
	h.waitRoute("empty", "", "/empty")
	h.eventually(5*time.Second, "the empty pool loaded", func() bool { return h.service("empty").pool.Load().snapshot().loaded })
	done := make(chan result, 1)
	go func() { done <- h.do(http.MethodPost, "/empty", bytes.NewReader(make([]byte, 300<<10))) }()
	h.eventually(5*time.Second, "the held request's body counted", func() bool {
		return h.g.Load().Queued["team-a/empty"] == 1 && h.g.cap.buffered.Load() == 300<<10 && h.g.cap.inflight.Load() == 1
	})
	if res := <-done; res.code != http.StatusServiceUnavailable {
		t.Errorf("held past its queue timeout: %d", res.code)
	}
	h.eventually(5*time.Second, "the buffers released", func() bool {
		return h.g.cap.buffered.Load() == 0 && h.g.cap.inflight.Load() == 0
	})
}
