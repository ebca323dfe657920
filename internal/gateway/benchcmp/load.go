package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// The load generator: closed-loop workers, each on one keep-alive HTTP/1.1
// connection of its own, written directly on the socket (net/http's client
// costs several times more CPU per request, which on two cores would be
// taken from the proxy under test). The same request bytes go to every arm.

// sample is one request: when its answer was complete and how long it took.
type sample struct {
	end int64 // unix nanoseconds
	lat int64 // nanoseconds
	ok  bool  // a 200 with a complete body
}

// request is the HTTP/1.1 request every worker sends (a small JSON POST with
// the bearer token, as a client of an inference service does).
func request(host, secret string) []byte {
	return []byte(fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: gpujob-benchcmp\r\n"+
		"Authorization: Bearer %s\r\nContent-Type: application/json\r\nAccept: application/json\r\n"+
		"Content-Length: %d\r\n\r\n%s", requestPath, host, secret, len(requestBody), requestBody))
}

// load runs conns workers until ctx ends; worker i sends to addrOf(i). It
// returns every worker's samples.
func load(ctx context.Context, conns int, addrOf func(i int) string, req []byte) [][]sample {
	out := make([][]sample, conns)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = worker(ctx, addrOf(i), req)
		}()
	}
	wg.Wait()
	return out
}

func worker(ctx context.Context, addr string, req []byte) []sample {
	samples := make([]sample, 0, 4096)
	var c *clientConn
	defer func() {
		if c != nil {
			c.close()
		}
	}()
	for ctx.Err() == nil {
		if c == nil {
			var err error
			c, err = dial(addr)
			if err != nil {
				now := time.Now().UnixNano()
				samples = append(samples, sample{end: now})
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Millisecond):
				}
				continue
			}
		}
		t0 := time.Now()
		status, keep, err := c.do(req)
		t1 := time.Now()
		samples = append(samples, sample{end: t1.UnixNano(), lat: int64(t1.Sub(t0)), ok: err == nil && status == 200})
		if err != nil || !keep {
			c.close()
			c = nil
		}
	}
	return samples
}

type clientConn struct {
	c  net.Conn
	br *bufio.Reader
}

func dial(addr string) (*clientConn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &clientConn{c: c, br: bufio.NewReaderSize(c, 16<<10)}, nil
}

func (c *clientConn) close() { _ = c.c.Close() }

// do sends req and reads the whole answer; keep is false when the server
// said it closes the connection.
func (c *clientConn) do(req []byte) (status int, keep bool, err error) {
	_ = c.c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := c.c.Write(req); err != nil {
		return 0, false, err
	}
	return readResponse(c.br)
}

var errBadResponse = errors.New("malformed response")

// readResponse reads one HTTP/1.1 response (Content-Length or chunked
// body) and returns its status.
func readResponse(br *bufio.Reader) (status int, keep bool, err error) {
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
			return 0, false, fmt.Errorf("%w: status line %q", errBadResponse, line)
		}
		status, err = strconv.Atoi(string(line[9:12]))
		if err != nil {
			return 0, false, fmt.Errorf("%w: status line %q", errBadResponse, line)
		}
		keep = line[7] == '1' // HTTP/1.1 keeps the connection unless told otherwise
		length := int64(-1)
		chunked := false
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return 0, false, err
			}
			h := bytes.TrimRight(line, "\r\n")
			if len(h) == 0 {
				break
			}
			k, v, ok := bytes.Cut(h, []byte(":"))
			if !ok {
				return 0, false, fmt.Errorf("%w: header %q", errBadResponse, h)
			}
			v = bytes.TrimSpace(v)
			switch {
			case bytes.EqualFold(k, []byte("Content-Length")):
				if length, err = strconv.ParseInt(string(v), 10, 64); err != nil || length < 0 {
					return 0, false, fmt.Errorf("%w: Content-Length %q", errBadResponse, v)
				}
			case bytes.EqualFold(k, []byte("Transfer-Encoding")):
				chunked = bytes.EqualFold(v, []byte("chunked"))
			case bytes.EqualFold(k, []byte("Connection")):
				if bytes.EqualFold(v, []byte("close")) {
					keep = false
				} else if bytes.EqualFold(v, []byte("keep-alive")) {
					keep = true
				}
			}
		}
		if status >= 100 && status < 200 {
			continue // an interim answer; the real one follows
		}
		switch {
		case status == 204 || status == 304:
		case chunked:
			if err := readChunked(br); err != nil {
				return 0, false, err
			}
		case length >= 0:
			if _, err := br.Discard(int(length)); err != nil {
				return 0, false, err
			}
		default:
			// Delimited by the close.
			if _, err := io.Copy(io.Discard, br); err != nil {
				return 0, false, err
			}
			keep = false
		}
		return status, keep, nil
	}
}

func readChunked(br *bufio.Reader) error {
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		sz := bytes.TrimRight(line, "\r\n")
		if i := bytes.IndexByte(sz, ';'); i >= 0 {
			sz = sz[:i]
		}
		n, err := strconv.ParseInt(string(bytes.TrimSpace(sz)), 16, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("%w: chunk size %q", errBadResponse, line)
		}
		if n == 0 {
			// Trailers, up to the empty line.
			for {
				line, err := br.ReadSlice('\n')
				if err != nil {
					return err
				}
				if len(bytes.TrimRight(line, "\r\n")) == 0 {
					return nil
				}
			}
		}
		if _, err := br.Discard(int(n)); err != nil {
			return err
		}
		if _, err := br.Discard(2); err != nil {
			return err
		}
	}
}
