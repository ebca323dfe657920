package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
	"time"
)

// maxAttempts bounds the replicas one request is sent to; only a refused
// connection (nothing reached the replica) moves it to the next.
const maxAttempts = 3

// ReplicaHeader names, in every proxied response, the replica (Consul
// service ID) that answered.
const ReplicaHeader = "X-Gpujob-Replica"

// newTransport is the one Transport of all proxied requests, tuned for many
// requests to few replicas: large idle pools, HTTP/1.1 to the replicas (the
// Python servers speak nothing else), no transparent gzip (the client's
// Accept-Encoding goes through and the replica's encoding comes back as
// is), and no header timeout of its own (the route's Timeout governs).
func newTransport() *http.Transport {
	return &http.Transport{
		DialContext: (&net.Dialer{
			// A replica that does not answer a SYN for this long is
			// treated as refusing (and the request goes elsewhere).
			Timeout:   3 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
}

// proxy sends the request to a replica of e's service and streams the
// answer back. A replica that refuses the connection is ejected and the
// request goes to another (up to maxAttempts): it never reached the first,
// so it cannot run twice. Any other failure is the client's 502, or 504
// when the route's Timeout ran out.
func (g *Gateway) proxy(w http.ResponseWriter, r *http.Request, e *routeEntry, body *body, out *outcome) {
	s := e.svc
	// The client's context: a client that goes away cancels the upstream
	// request.
	var (
		ctx    context.Context
		cancel context.CancelFunc
	)
	if t := e.route.Timeout.Std(); t > 0 {
		ctx, cancel = context.WithTimeout(r.Context(), t)
	} else {
		ctx, cancel = context.WithCancel(r.Context())
	}
	defer cancel()
	s.inflight.Add(1)
	defer s.inflight.Add(-1)

	path, rawPath := stripPrefix(e.prefix, r.URL)
	hdr := outboundHeader(r, e.route.Auth)
	var (
		tried   []string
		lastErr error
		lastEp  *endpoint
	)
	for range maxAttempts {
		ep := pick(s.pool.Load().snapshot().eps, tried, time.Now())
		if ep == nil {
			break
		}
		tried = append(tried, ep.id)
		req, err := outboundRequest(ctx, r.Method, ep, path, rawPath, r.URL.RawQuery, hdr, body)
		if err != nil {
			out.code = http.StatusBadGateway
			writeError(w, out.code, fmt.Sprintf("replica %s: %v", ep.id, err))
			return
		}
		ep.load.inflight.Add(1)
		resp, err := g.transport.RoundTrip(req)
		if err != nil {
			ep.load.inflight.Add(-1)
			lastErr, lastEp = err, ep
			if ctx.Err() == nil && isDialError(err) {
				ep.eject(time.Now().Add(g.cfg.EjectFor))
				continue
			}
			break
		}
		g.respond(w, resp, ep, out)
		return
	}

	switch {
	case lastEp == nil:
		// The pool emptied between the hold and the pick.
		out.code = g.unavailable(w, s, "(its replicas just went away)")
		return
	case r.Context().Err() != nil:
		out.code, out.version = statusClientClosed, lastEp.version
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		out.code, out.version = http.StatusGatewayTimeout, lastEp.version
		writeError(w, out.code, fmt.Sprintf("replica %s did not answer within %s", lastEp.id, e.route.Timeout.Std()))
	default:
		out.code, out.version = http.StatusBadGateway, lastEp.version
		writeError(w, out.code, fmt.Sprintf("replica %s: %v", lastEp.id, lastErr))
	}
}

// isDialError reports whether err is a failure to connect, so that the
// request cannot have reached the replica. A reused idle connection that
// fails before anything is written is retried by the Transport itself
// (the request has GetBody); nothing else is safe to send again.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// respond streams a replica's response to the client. An answer of unknown
// length (chunked: tokens as they are made) or of server-sent events is
// flushed after every write so that it arrives as it comes; one with a
// Content-Length is left to the server's buffer, which sends it in one
// piece (a flush per write cost a third of the gateway's writes and split
// each answer in two; httputil.ReverseProxy decides the same way).
func (g *Gateway) respond(w http.ResponseWriter, resp *http.Response, ep *endpoint, out *outcome) {
	defer ep.load.inflight.Add(-1)
	defer resp.Body.Close()
	h := w.Header()
	removeHopByHop(resp.Header)
	for k, vv := range resp.Header {
		h[k] = append(h[k], vv...)
	}
	announced := len(resp.Trailer)
	if announced > 0 {
		keys := make([]string, 0, announced)
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		h.Add("Trailer", strings.Join(keys, ", "))
	}
	h.Set(ReplicaHeader, ep.id)
	out.code, out.version = resp.StatusCode, ep.version
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	flush := resp.ContentLength < 0 || strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	if flush {
		_ = rc.Flush()
	}

	if err := copyFlushing(w, rc, resp.Body, flush, g.cfg.WriteIdleTimeout); err != nil {
		if errors.Is(err, errClientWrite) {
			return // the client went away; the deferred Close ends the upstream
		}
		// The replica's answer broke off (or the route's Timeout ran out):
		// abort the response, so the client sees it incomplete rather
		// than a clean end.
		panic(http.ErrAbortHandler)
	}
	if len(resp.Trailer) == announced {
		for k, vv := range resp.Trailer {
			h[k] = vv
		}
		return
	}
	for k, vv := range resp.Trailer {
		h[http.TrailerPrefix+k] = vv
	}
}

var errClientWrite = errors.New("writing to the client")

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyFlushing copies src to w, flushing after each write when flush is
// set. Each write must be taken by the client within idle: one that reads
// nothing of an answer for that long (a slow read, to hold the gateway's
// request slots) is cut off. The deadline is cleared after each write, so
// that none is left for the next request on the connection.
func copyFlushing(w io.Writer, rc *http.ResponseController, src io.Reader, flush bool, idle time.Duration) error {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	deadlines := idle > 0
	defer func() {
		if deadlines {
			_ = rc.SetWriteDeadline(time.Time{})
		}
	}()
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if deadlines && rc.SetWriteDeadline(time.Now().Add(idle)) != nil {
				deadlines = false // not a net.Conn underneath (tests)
			}
			if _, err := w.Write(buf[:n]); err != nil {
				return fmt.Errorf("%w: %w", errClientWrite, err)
			}
			if flush {
				if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
					return fmt.Errorf("%w: %w", errClientWrite, err)
				}
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// outboundRequest is one attempt's request to ep. The body is a fresh
// reader each time (and GetBody lets the Transport resend it on a stale
// pooled connection).
func outboundRequest(ctx context.Context, method string, ep *endpoint, path, rawPath, rawQuery string, hdr http.Header, b *body) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://"+ep.addr+"/", nil)
	if err != nil {
		return nil, fmt.Errorf("building the request: %w", err)
	}
	if b != nil && b.size > 0 {
		req.Body, req.ContentLength = b.reader(), b.size
		req.GetBody = func() (io.ReadCloser, error) { return b.reader(), nil }
	}
	req.URL.Path, req.URL.RawPath, req.URL.RawQuery = path, rawPath, rawQuery
	req.Header = hdr
	return req, nil
}

// stripPrefix is the request's path without the route's prefix ("/" when
// nothing is left), in both its decoded and (when set) raw forms.
func stripPrefix(prefix string, u *url.URL) (path, rawPath string) {
	path = strings.TrimPrefix(u.Path, prefix)
	if path == "" {
		path = "/"
	}
	if u.RawPath != "" {
		if rp, ok := strings.CutPrefix(u.RawPath, prefix); ok {
			rawPath = rp
			if rawPath == "" {
				rawPath = "/"
			}
		}
		// Otherwise the prefix was itself escaped in the raw path: the
		// decoded path alone is sent (url re-escapes it).
	}
	if !strings.HasPrefix(path, "/") || rawPath != "" && !strings.HasPrefix(rawPath, "/") {
		// "/svc%2Fx" matches the route "/svc" decoded, but its raw rest
		// "%2Fx" is no path: send the decoded one, rooted.
		path, rawPath = "/"+strings.TrimLeft(path, "/"), ""
	}
	return path, rawPath
}

// hopByHop are the headers of one connection, never forwarded (RFC 9110
// §7.6.1), besides those the Connection header names.
var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func removeHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for _, name := range strings.Split(v, ",") {
			if name = textproto.TrimString(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
}

// outboundHeader is the header sent to the replica: the client's, less the
// hop-by-hop headers, Expect (the body is already read) and, on routes with
// Auth, the bearer secret; plus the X-Forwarded ones.
func outboundHeader(r *http.Request, auth bool) http.Header {
	h := r.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	// "Te: trailers" says the client accepts trailers; it is passed on
	// (as net/http/httputil does) so that the replica may send them.
	te := httpHeaderHasToken(h, "Te", "trailers")
	removeHopByHop(h)
	if te {
		h.Set("Te", "trailers")
	}
	h.Del("Expect")
	if auth {
		h.Del("Authorization")
	}
	if prior := h.Values("X-Forwarded-For"); len(prior) > 0 {
		h.Set("X-Forwarded-For", strings.Join(prior, ", ")+", "+clientIP(r))
	} else {
		h.Set("X-Forwarded-For", clientIP(r))
	}
	h.Set("X-Forwarded-Host", r.Host)
	if r.TLS != nil {
		h.Set("X-Forwarded-Proto", "https")
	} else {
		h.Set("X-Forwarded-Proto", "http")
	}
	if _, ok := h["User-Agent"]; !ok {
		// An empty value keeps the Transport from adding its own.
		h.Set("User-Agent", "")
	}
	return h
}

func httpHeaderHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(textproto.TrimString(t), token) {
				return true
			}
		}
	}
	return false
}
