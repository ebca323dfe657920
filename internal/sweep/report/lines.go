package report

import "bytes"

// maxLineLen bounds the line a LineWriter holds: a rank that prints
// megabytes without a newline (a progress bar, binary data) must not grow
// the supervisor's memory. A longer line cannot be a metric line the
// record could hold anyway; it is skipped up to its newline.
const maxLineLen = 64 << 10

// LineWriter splits what is written to it into lines for a callback. It
// never fails and never blocks beyond the callback, so it can sit beside a
// rank's output without slowing the rank. One LineWriter serves one stream
// (one start of one rank): a partial line never joins the next process's
// first.
type LineWriter struct {
	// OnSkip, when set, hears of each line skipped for its length
	// (Reporter.Skipped counts them).
	OnSkip   func()
	line     func(string)
	buf      []byte
	skipping bool // inside a line longer than maxLineLen
}

// NewLineWriter returns a LineWriter that calls line with each complete
// line, without its newline.
func NewLineWriter(line func(string)) *LineWriter {
	return &LineWriter{line: line}
}

// Write always takes all of p.
func (w *LineWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.hold(p)
			break
		}
		w.hold(p[:i])
		if !w.skipping {
			w.line(string(w.buf))
		}
		w.buf, w.skipping = w.buf[:0], false
		p = p[i+1:]
	}
	return n, nil
}

// hold keeps part of the current line, unless it has grown too long.
func (w *LineWriter) hold(p []byte) {
	if w.skipping {
		return
	}
	if len(w.buf)+len(p) > maxLineLen {
		w.buf, w.skipping = w.buf[:0], true
		if w.OnSkip != nil {
			w.OnSkip()
		}
		return
	}
	w.buf = append(w.buf, p...)
}

// Close passes on a last line that had no newline (a rank's final print
// without one).
func (w *LineWriter) Close() error {
	if len(w.buf) > 0 && !w.skipping {
		w.line(string(w.buf))
	}
	w.buf, w.skipping = nil, false
	return nil
}
