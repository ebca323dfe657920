package gateway

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// bodyChunk is the unit request bodies are buffered in: memory grows with
// what has arrived, never with what a Content-Length promises.
const bodyChunk = 64 << 10

// body is a buffered request body and the capacity it holds.
type body struct {
	chunks   [][]byte
	size     int64
	reserved int64
}

// reader reads the body from its start (a fresh one per attempt).
func (b *body) reader() io.ReadCloser {
	return io.NopCloser(&chunkReader{chunks: b.chunks})
}

type chunkReader struct {
	chunks [][]byte
	off    int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.chunks) > 0 && r.off == len(r.chunks[0]) {
		r.chunks, r.off = r.chunks[1:], 0
	}
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.chunks[0][r.off:])
	r.off += n
	return n, nil
}

// bodyLimit is the largest body a request to e may have: the route's
// max_body_bytes, else the gateway's default, and never more than the
// gateway could ever buffer.
func (g *Gateway) bodyLimit(e *routeEntry) int64 {
	limit := g.cfg.MaxBodyBytes
	if e.route.MaxBodyBytes > 0 {
		limit = e.route.MaxBodyBytes
	}
	return min(limit, g.cap.largestBody())
}

// readBody buffers the request body, so that it can be sent again to
// another replica when the first refused the connection. It reserves the
// body's bytes in the gateway's capacity first (the whole Content-Length
// at once, else chunk by chunk), and reads it no slower than the gateway's
// body rate allows: each read must come within BodyGrace of the last, and
// the whole body at BodyMinRate after a first BodyGrace. A slow client is
// answered 408 and cut off, so that a trickle (a slowloris of the body)
// cannot hold a buffer and a request slot for ever. It returns the body
// (nil when there is none) or the status it answered; the caller releases
// the body's reservation.
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request, e *routeEntry) (*body, int) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, 0
	}
	limit := g.bodyLimit(e)
	tooLarge := func() (*body, int) {
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes (the route's max_body, else the gateway's --max-body)", limit))
		return nil, http.StatusRequestEntityTooLarge
	}
	if r.ContentLength > limit {
		return tooLarge()
	}
	b := &body{}
	known := r.ContentLength >= 0
	if known {
		if !g.cap.reserve(r.ContentLength, r.ContentLength) {
			return nil, g.shed(w, shedBuffer, true)
		}
		b.reserved = r.ContentLength
	}
	fail := func(code int) (*body, int) {
		g.cap.release(b.reserved)
		return nil, code
	}

	rc := http.NewResponseController(w)
	deadlines := true
	done := func(b *body) (*body, int) {
		if deadlines {
			// Cleared at once: the server reads on after the body, to
			// see the client go, and a deadline left would end that read
			// and cancel the request. (A body left unread keeps its
			// deadline: dropUnreadBody.)
			_ = rc.SetReadDeadline(time.Time{})
		}
		return b, 0
	}
	start := time.Now()
	for {
		size := int64(bodyChunk)
		if known {
			size = min(size, r.ContentLength-b.size)
			if size == 0 {
				return done(b) // all of it
			}
		} else {
			size = min(size, limit+1-b.size)
			if size <= 0 {
				fail(0)
				return tooLarge()
			}
			if !g.cap.reserve(size, b.size+size) {
				return fail(g.shed(w, shedBuffer, true))
			}
			b.reserved += size
		}
		buf := make([]byte, size)
		n, eof := 0, false
		for n < len(buf) && !eof {
			if deadlines {
				if err := rc.SetReadDeadline(g.bodyDeadline(start, b.size+int64(n))); err != nil {
					deadlines = false // not a net.Conn underneath (tests): no deadline to set
				}
			}
			m, err := r.Body.Read(buf[n:])
			n += m
			switch {
			case err == nil:
			case err == io.EOF:
				eof = true
			case errors.Is(err, os.ErrDeadlineExceeded):
				g.metrics.shed.WithLabelValues(shedSlowBody).Inc()
				w.Header().Set("Connection", "close")
				writeError(w, http.StatusRequestTimeout,
					fmt.Sprintf("request body too slow: under %d bytes/s, or a pause over %s", g.cfg.BodyMinRate, g.cfg.BodyGrace))
				return fail(http.StatusRequestTimeout)
			case r.Context().Err() != nil:
				return fail(statusClientClosed)
			default:
				writeError(w, http.StatusBadRequest, "reading the request body: "+err.Error())
				return fail(http.StatusBadRequest)
			}
		}
		if n > 0 {
			b.chunks = append(b.chunks, buf[:n])
			b.size += int64(n)
		}
		if !known {
			// Give back what the chunk did not use.
			unused := int64(len(buf) - n)
			g.cap.release(unused)
			b.reserved -= unused
			if b.size > limit {
				fail(0)
				return tooLarge()
			}
		}
		if eof {
			if known && b.size != r.ContentLength {
				writeError(w, http.StatusBadRequest, "request body shorter than its Content-Length")
				return fail(http.StatusBadRequest)
			}
			return done(b)
		}
	}
}

// bodyDeadline is when the next bytes of a body must have arrived, read
// bytes into it, begun at start: within BodyGrace of now (no pause longer
// than that), and at BodyMinRate on average after a first BodyGrace.
func (g *Gateway) bodyDeadline(start time.Time, read int64) time.Time {
	pause := time.Now().Add(g.cfg.BodyGrace)
	avg := start.Add(g.cfg.BodyGrace + time.Duration(float64(read+bodyChunk)/float64(g.cfg.BodyMinRate)*float64(time.Second)))
	if avg.Before(pause) {
		return avg
	}
	return pause
}
