package spec

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
)

// Format renders diagnostics one per line,
//
//	file:line:col: error: summary: detail
//
// each followed, when the source is at hand, by the source line and a caret
// under the subject (indented, so `grep '^[^ ]'` keeps the one-liners).
// files are the sources a Load returned; a file missing there is read from
// disk, and one that cannot be read gets no excerpt.
func Format(diags hcl.Diagnostics, files map[string]*hcl.File) string {
	var b strings.Builder
	read := map[string][]byte{}
	source := func(name string) []byte {
		if f, ok := files[name]; ok && f != nil {
			return f.Bytes
		}
		if src, ok := read[name]; ok {
			return src
		}
		src, err := os.ReadFile(name)
		if err != nil {
			src = nil
		}
		read[name] = src
		return src
	}
	for _, d := range diags {
		sev := "error"
		if d.Severity == hcl.DiagWarning {
			sev = "warning"
		}
		if d.Subject != nil {
			fmt.Fprintf(&b, "%s:%d:%d: ", printableName(d.Subject.Filename), d.Subject.Start.Line, d.Subject.Start.Column)
		}
		b.WriteString(sev)
		b.WriteString(": ")
		b.WriteString(oneLine(d.Summary))
		if detail := oneLine(d.Detail); detail != "" {
			b.WriteString(": ")
			b.WriteString(detail)
		}
		b.WriteByte('\n')
		if d.Subject != nil {
			b.WriteString(excerpt(source(d.Subject.Filename), *d.Subject))
		}
	}
	return b.String()
}

// printableName escapes the control characters (and invalid UTF-8) of a
// file name, which would break the one-line-per-error form: a -var's
// pseudo-file is named after the argument, newlines and all (found by
// FuzzParse).
func printableName(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0 {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}

// excerpt prints the subject's first line with a caret under it.
func excerpt(src []byte, rng hcl.Range) string {
	if src == nil || rng.Start.Line < 1 {
		return ""
	}
	lines := bytes.SplitAfter(src, []byte("\n"))
	if rng.Start.Line > len(lines) {
		return ""
	}
	line := strings.TrimRight(string(lines[rng.Start.Line-1]), "\r\n")
	// The byte offset of the start of the line gives the subject's column
	// in bytes; fall back to the (character) column.
	lineStart := 0
	for _, l := range lines[:rng.Start.Line-1] {
		lineStart += len(l)
	}
	col := rng.Start.Byte - lineStart
	if col < 0 || col > len(line) {
		col = min(max(rng.Start.Column-1, 0), len(line))
	}
	end := len(line)
	if rng.End.Line == rng.Start.Line {
		end = min(max(rng.End.Byte-lineStart, col+1), len(line))
	}
	var pad strings.Builder
	for _, r := range line[:col] {
		if r == '\t' {
			pad.WriteByte('\t')
		} else {
			pad.WriteByte(' ')
		}
	}
	width := max(utf8.RuneCountInString(line[col:max(end, col)]), 1)
	gutter := fmt.Sprintf("%5d | ", rng.Start.Line)
	return fmt.Sprintf("%s%s\n%s| %s%s\n", gutter, line, strings.Repeat(" ", len(gutter)-2), pad.String(), strings.Repeat("^", width))
}

// CheckFits reports a spec whose gpus_per_worker exceeds what any node holds
// (maxGPUsPerNode: the most nvidia/gpu devices one node has), at the
// gpus_per_worker attribute: Nomad could never place such an allocation.
func CheckFits(t *Train, maxGPUsPerNode int) hcl.Diagnostics {
	if t == nil || t.GPUsPerWorker <= maxGPUsPerNode {
		return nil
	}
	rng := t.Ranges.GPUsPerWorker
	var detail string
	if maxGPUsPerNode <= 0 {
		detail = fmt.Sprintf("gpus_per_worker = %d, but no node in the cluster has an nvidia/gpu device; use gpus_per_worker = 0 for a CPU job.", t.GPUsPerWorker)
	} else {
		detail = fmt.Sprintf("gpus_per_worker = %d, but no node holds more than %d nvidia/gpu device(s): an allocation can never be placed. Ask for at most %d per worker and more workers instead.", t.GPUsPerWorker, maxGPUsPerNode, maxGPUsPerNode)
	}
	return hcl.Diagnostics{{
		Severity: hcl.DiagError,
		Summary:  "Spec cannot fit the cluster",
		Detail:   detail,
		Subject:  &rng,
	}}
}

// CheckCapacity reports a spec whose workers exceed most, the workers of its
// size the cluster could hold even when empty (explain.EmptyCapacity), at
// the workers attribute: such a group would be registered, partly placed,
// and wait for ever on a rendezvous that can never complete. nodes words
// the capacity per node.
func CheckCapacity(t *Train, most int, nodes string) hcl.Diagnostics {
	if t == nil || t.Workers <= most {
		return nil
	}
	size := fmt.Sprintf("%d MHz CPU, %d MiB memory", t.WorkerCPU(), t.WorkerMemoryMiB())
	if t.GPUsPerWorker > 0 {
		size = fmt.Sprintf("%d GPU(s), %s", t.GPUsPerWorker, size)
	}
	advice := "ask for fewer workers, or smaller ones."
	if most > 0 {
		advice = fmt.Sprintf("ask for at most %d workers, or smaller ones.", most)
	}
	rng := t.Ranges.Workers
	return hcl.Diagnostics{{
		Severity: hcl.DiagError,
		Summary:  "Spec cannot fit the cluster",
		Detail: fmt.Sprintf("train %q: workers = %d cannot fit: the cluster could hold at most %d workers of this size (%s) even when empty (%s); %s",
			t.Name, t.Workers, most, size, nodes, advice),
		Subject: &rng,
	}}
}
