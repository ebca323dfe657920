package gpujobs

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"

	"github.com/gpujob/gpujob/internal/contract"
)

// SplitRankPrefix splits "[rank N] rest" (the driver's prefix when a member
// runs several local processes) into N and rest.
func SplitRankPrefix(line string) (rank int, rest string, ok bool) {
	if !strings.HasPrefix(line, contract.RankLinePrefix) {
		return 0, line, false
	}
	end := strings.IndexByte(line, ']')
	if end < 0 {
		return 0, line, false
	}
	n, err := strconv.Atoi(line[len(contract.RankLinePrefix):end])
	if err != nil || n < 0 {
		return 0, line, false
	}
	rest = line[end+1:]
	rest = strings.TrimPrefix(rest, " ")
	return n, rest, true
}

// Loss is one progress line of the workload:
// "gpujob: step=40 epoch=0 rank=2 loss=0.6931 global_loss=0.6930 samples_per_sec=1650.2 ...".
type Loss struct {
	Rank          int      `json:"rank"`
	Step          int      `json:"step"`
	Epoch         int      `json:"epoch"`
	Loss          float64  `json:"loss"`
	GlobalLoss    *float64 `json:"global_loss,omitempty"`
	SamplesPerSec *float64 `json:"samples_per_sec,omitempty"`
}

// ParseLoss reads a progress line (a rank prefix is allowed). The rank is
// the line's rank= field, else the prefix's, else -1.
func ParseLoss(line string) (Loss, bool) {
	prefixRank, rest, prefixed := SplitRankPrefix(strings.TrimRight(line, "\r"))
	body, ok := strings.CutPrefix(rest, contract.ProgressLinePrefix)
	if !ok || !strings.HasPrefix(body, "step=") {
		return Loss{}, false
	}
	l := Loss{Rank: -1}
	if prefixed {
		l.Rank = prefixRank
	}
	seen := false
	for _, field := range strings.Fields(body) {
		k, v, ok := strings.Cut(field, "=")
		if !ok {
			continue
		}
		switch k {
		case "step":
			l.Step, _ = strconv.Atoi(v)
		case "epoch":
			l.Epoch, _ = strconv.Atoi(v)
		case "rank":
			if n, err := strconv.Atoi(v); err == nil {
				l.Rank = n
			}
		case "loss":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return Loss{}, false
			}
			l.Loss, seen = f, true
		case "global_loss":
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				l.GlobalLoss = &f
			}
		case "samples_per_sec":
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				l.SamplesPerSec = &f
			}
		}
	}
	if !seen {
		return Loss{}, false
	}
	return l, true
}

// ResultPrefix starts rank 0's final line.
const ResultPrefix = contract.ResultLinePrefix

// ParseResult reads rank 0's "gpujob-result: {json}" line (a rank prefix
// is allowed).
func ParseResult(line string) (map[string]any, bool) {
	_, rest, _ := SplitRankPrefix(strings.TrimRight(line, "\r"))
	body, ok := strings.CutPrefix(rest, ResultPrefix)
	if !ok {
		return nil, false
	}
	var m map[string]any
	if json.Unmarshal([]byte(body), &m) != nil {
		return nil, false
	}
	return m, true
}

// ResultNumber is a numeric field of a result, if present.
func ResultNumber(result map[string]any, key string) (float64, bool) {
	f, ok := result[key].(float64)
	return f, ok
}

// Scan reads a member's log text: the latest loss line per rank, in rank
// order, and the last result line.
func Scan(text []byte) (losses []Loss, result map[string]any) {
	latest := map[int]Loss{}
	order := []int{}
	for len(text) > 0 {
		var line []byte
		if i := bytes.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			line, text = text, nil
		}
		s := string(line)
		if l, ok := ParseLoss(s); ok {
			if _, seen := latest[l.Rank]; !seen {
				order = append(order, l.Rank)
			}
			latest[l.Rank] = l
			continue
		}
		if r, ok := ParseResult(s); ok {
			result = r
		}
	}
	slices.Sort(order)
	for _, r := range order {
		losses = append(losses, latest[r])
	}
	return losses, result
}

// LineSplitter turns a stream of chunks into whole lines.
type LineSplitter struct {
	buf []byte
}

// Write adds a chunk and returns the lines it completed (without "\n").
func (s *LineSplitter) Write(chunk []byte) []string {
	s.buf = append(s.buf, chunk...)
	var lines []string
	for {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 {
			break
		}
		lines = append(lines, strings.TrimSuffix(string(s.buf[:i]), "\r"))
		s.buf = s.buf[i+1:]
	}
	if len(s.buf) == 0 {
		s.buf = nil // let the backing array go
	}
	return lines
}

// Flush returns the unterminated last line, if any.
func (s *LineSplitter) Flush() (string, bool) {
	if len(s.buf) == 0 {
		return "", false
	}
	line := strings.TrimSuffix(string(s.buf), "\r")
	s.buf = nil
	return line, true
}
