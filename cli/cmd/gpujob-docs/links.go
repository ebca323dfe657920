package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"path"
	"regexp"
	"sort"
	"strings"
	"unicode"
)

// linkTarget matches the target of an inline markdown link or image,
// [text](target) or [text](target "title").
var linkTarget = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)

// CheckLinks checks every relative link of README.md and docs/**/*.md in
// fsys: the file or directory it names exists, and its #anchor, if any, is
// a heading of the markdown file it points into. It returns one line per
// broken link, "file:line: why".
func CheckLinks(fsys fs.FS) ([]string, error) {
	files := []string{"README.md"}
	err := fs.WalkDir(fsys, "docs", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil && !isNotExist(err) {
		return nil, fmt.Errorf("list docs: %w", err)
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(p string) (map[string]bool, error) {
		if a, ok := anchors[p]; ok {
			return a, nil
		}
		src, err := fs.ReadFile(fsys, p)
		if err != nil {
			return nil, err
		}
		a := Anchors(src)
		anchors[p] = a
		return a, nil
	}
	var broken []string
	for _, file := range files {
		src, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", file, err)
		}
		for _, l := range Links(src) {
			why := checkLink(fsys, file, l.Target, anchorsOf)
			if why != "" {
				broken = append(broken, fmt.Sprintf("%s:%d: %s: %s", file, l.Line, l.Target, why))
			}
		}
	}
	sort.Strings(broken)
	return broken, nil
}

// checkLink says why the link target in file does not resolve, or "".
func checkLink(fsys fs.FS, file, target string, anchorsOf func(string) (map[string]bool, error)) string {
	if u, err := url.Parse(target); err != nil {
		return "not a URL"
	} else if u.Scheme != "" || strings.HasPrefix(target, "//") {
		return "" // external: not checked
	}
	p, frag, _ := strings.Cut(target, "#")
	dest := file
	if p != "" {
		if strings.HasPrefix(p, "/") {
			return "an absolute path: use a path relative to the file"
		}
		unescaped, err := url.PathUnescape(p)
		if err != nil {
			return "a bad escape"
		}
		dest = path.Join(path.Dir(file), unescaped)
		if dest == ".." || strings.HasPrefix(dest, "../") {
			return "outside the repository"
		}
		info, err := fs.Stat(fsys, dest)
		if err != nil {
			return "no such file or directory"
		}
		if info.IsDir() && frag != "" {
			return "an anchor into a directory"
		}
	}
	if frag == "" || !strings.HasSuffix(dest, ".md") {
		return ""
	}
	a, err := anchorsOf(dest)
	if err != nil {
		return fmt.Sprintf("read %s: %v", dest, err)
	}
	if !a[frag] {
		return fmt.Sprintf("no heading #%s in %s", frag, dest)
	}
	return ""
}

// Link is a link target and the line it is on.
type Link struct {
	Target string
	Line   int
}

// Links returns the inline link targets of a markdown document, outside
// fenced code blocks and code spans.
func Links(src []byte) []Link {
	var links []Link
	forEachProseLine(src, func(n int, line string) {
		for _, m := range linkTarget.FindAllStringSubmatch(withoutCodeSpans(line), -1) {
			links = append(links, Link{Target: m[1], Line: n})
		}
	})
	return links
}

// Anchors returns the anchors GitHub gives a document's headings
// (Slug, with -1, -2, … on repeats) and its explicit <a name|id="…">.
func Anchors(src []byte) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	explicit := regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	forEachProseLine(src, func(_ int, line string) {
		for _, m := range explicit.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		trimmed := strings.TrimLeft(line, " ")
		if len(line)-len(trimmed) > 3 || !strings.HasPrefix(trimmed, "#") {
			return
		}
		text := strings.TrimLeft(trimmed, "#")
		if level := len(trimmed) - len(text); level > 6 || (text != "" && text[0] != ' ') {
			return
		}
		s := Slug(strings.TrimRight(strings.TrimSpace(text), "#"))
		if n := seen[s]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			anchors[s] = true
		}
		seen[s]++
	})
	return anchors
}

// Slug is GitHub's anchor of a heading: lower case, letters, digits,
// spaces as dashes, dashes and underscores kept, everything else dropped
// (markdown link text keeps only its text).
func Slug(heading string) string {
	heading = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// forEachProseLine calls fn with each line outside fenced code blocks.
func forEachProseLine(src []byte, fn func(n int, line string)) {
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	fence := ""
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			marker := trimmed[:1]
			fence = marker + strings.Repeat(marker, len(trimmed)-len(strings.TrimLeft(trimmed, marker))-1)
			continue
		}
		fn(n, line)
	}
}

// withoutCodeSpans blanks the `code spans` of a line.
func withoutCodeSpans(line string) string {
	var b strings.Builder
	inCode := false
	for _, r := range line {
		if r == '`' {
			inCode = !inCode
			b.WriteRune(' ')
			continue
		}
		if inCode {
			b.WriteRune(' ')
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
