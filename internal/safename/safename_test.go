package safename

import (
	"errors"
	"math/rand"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestEncode(t *testing.T) {
	long := strings.Repeat("a", MaxLen)
	cases := []struct{ in, want string }{
		// Ordinary names are their own encoding: the existing layout stays.
		{"bert-finetune", "bert-finetune"},
		{"train_1", "train_1"},
		{"default", "default"},
		{"1764490000", "1764490000"},
		{"bert.v2", "bert.v2"},
		{"a..", "a.."},
		{"-x", "-x"},
		{long, long},
		// Everything else is escaped.
		{"", "~"},
		{".", "~2E"},
		{"..", "~2E."},
		{".hidden", "~2Ehidden"},
		{"a/b", "a~2Fb"},
		{"../../x", "~2E.~2F..~2Fx"},
		{`a\b`, "a~5Cb"},
		{"a%2Fb", "a~252Fb"},
		{"~", "~7E"},
		{"~7E", "~7E7E"},
		{"with space", "with~20space"},
		{"q?h#", "q~3Fh~23"},
		{"nul\x00", "nul~00"},
		{"tab\tnl\n", "tab~09nl~0A"},
		{"données", "donn~C3~A9es"},
		{"\xff", "~FF"},
	}
	for _, c := range cases {
		if got := Encode(c.in); got != c.want {
			t.Errorf("Encode(%q) = %q, want %q", c.in, got, c.want)
		}
		if got, err := Decode(c.want); err != nil || got != c.in {
			t.Errorf("Decode(%q) = %q, %v; want %q", c.want, got, err, c.in)
		}
	}
}

func TestEncodeShortensLongNames(t *testing.T) {
	cases := []string{
		strings.Repeat("a", MaxLen+1),
		strings.Repeat("a", 300),
		strings.Repeat("../", 100),
		strings.Repeat("é", 50), // 100 bytes, 300 encoded
		strings.Repeat("a", 61) + "/" + strings.Repeat("b", 100),
		strings.Repeat("a", 60) + "/" + strings.Repeat("b", 100),
		strings.Repeat("a", 59) + "/" + strings.Repeat("b", 100),
	}
	seen := map[string]string{}
	for _, in := range cases {
		got := Encode(in)
		if len(got) > MaxLen {
			t.Errorf("Encode(%.20q…) is %d bytes, more than %d", in, len(got), MaxLen)
		}
		if !strings.Contains(got, hashMark) {
			t.Errorf("Encode(%.20q…) = %q: not shortened", in, got)
		}
		// The prefix is the start of the full encoding, cut between code
		// words, so it is readable and decodes.
		prefix, _, _ := strings.Cut(got, hashMark)
		if prefix == "" {
			t.Errorf("Encode(%.20q…) = %q: no readable prefix", in, got)
		}
		if dec, err := Decode(prefix); err != nil || !strings.HasPrefix(in, dec) {
			t.Errorf("prefix %q of Encode(%.20q…) decodes to %q, %v", prefix, in, dec, err)
		}
		if _, err := Decode(got); !errors.Is(err, ErrHashed) {
			t.Errorf("Decode of shortened %q: %v, want ErrHashed", got, err)
		}
		if prev, ok := seen[got]; ok {
			t.Errorf("%.20q… and %.20q… both encode to %q", prev, in, got)
		}
		seen[got] = in
		assertSafe(t, in, got)
	}
}

func TestDecodeRefusesWhatEncodeDoesNotWrite(t *testing.T) {
	for _, seg := range []string{
		"", ".", "..", ".x", "a/b", "a b", "a~", "a~2", "a~2f", "a~zz", "~41", "~2D", "a~2E", "é",
		strings.Repeat("a", MaxLen+1),
	} {
		if got, err := Decode(seg); err == nil {
			t.Errorf("Decode(%q) = %q, want an error", seg, got)
		}
	}
}

func TestValidate(t *testing.T) {
	ok := []string{"bert-finetune", "train_1", "e2e-cli-bad", "a", "7", "bert.v2", "A-b_c.d", strings.Repeat("x", MaxLen)}
	for _, name := range ok {
		if err := Validate(name); err != nil {
			t.Errorf("Validate(%q): %v", name, err)
		}
		// What gpujob accepts is its own encoding: paths and keys carry it
		// unchanged.
		if Encode(name) != name {
			t.Errorf("accepted %q encodes to %q", name, Encode(name))
		}
	}
	bad := []struct{ name, want string }{
		{"", "is empty"},
		{strings.Repeat("x", MaxLen+1), "129 bytes long"},
		{"../../../../../tmp/escaped", "starts with '.'"},
		{"..", "starts with '.'"},
		{".hidden", "starts with '.'"},
		{"-rf", `starts with '-'`},
		{"_x", `starts with '_'`},
		{"a/b", "'/' (a path separator) at byte 1"},
		{"with space", "a space at byte 4"},
		{"a%2Fb", `'%' at byte 1`},
		{"a?b", `'?' at byte 1`},
		{"a~b", `'~' at byte 1`},
		{"nul\x00", `the control character '\x00' at byte 3`},
		{"tab\t", `the control character '\t' at byte 3`},
		{"données", `the non-ASCII character 'é' at byte 4`},
		{`a\b`, `'\\' at byte 1`},
	}
	for _, c := range bad {
		err := Validate(c.name)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%q) = %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// assertSafe fails t unless seg is one safe path segment and key segment.
func assertSafe(t *testing.T, in, seg string) {
	t.Helper()
	if seg == "" || seg == "." || seg == ".." || strings.HasPrefix(seg, ".") || len(seg) > MaxLen {
		t.Fatalf("Encode(%q) = %q: not one segment", in, seg)
	}
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if !(isAlnum(c) || strings.IndexByte("-_.~", c) >= 0) {
			t.Fatalf("Encode(%q) = %q: byte %d (%q) is not in [A-Za-z0-9._~-]", in, seg, i, c)
		}
	}
	// One segment under a root, whatever the root.
	root := "/ckpt"
	if p := filepath.Join(root, seg); filepath.Dir(p) != root || filepath.Base(p) != seg {
		t.Fatalf("Encode(%q) = %q: joined to %s it is %s", in, seg, root, p)
	}
}

// randomName draws from an alphabet heavy in the characters that matter:
// separators, dots, the escape and hex digits, control and non-ASCII bytes;
// sometimes long enough to be shortened.
func randomName(r *rand.Rand) string {
	const alphabet = "./\\~%?# \x00\t\nAaFf09-_"
	n := r.Intn(12)
	if r.Intn(8) == 0 {
		n = MaxLen - 8 + r.Intn(200)
	}
	b := make([]byte, n)
	for i := range b {
		switch r.Intn(10) {
		case 0:
			b[i] = byte(r.Intn(256))
		default:
			b[i] = alphabet[r.Intn(len(alphabet))]
		}
	}
	return string(b)
}

// TestEncodingIsInjectiveAndSafe is the property the package promises:
// distinct names give distinct segments, every segment is safe, and the
// unshortened ones decode to their name.
func TestEncodingIsInjectiveAndSafe(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	seen := map[string]string{}
	// Every short name over a small adversarial alphabet, then random ones.
	var names []string
	small := []string{"", ".", "/", "~", "7", "E", "a"}
	names = append(names, small...)
	for _, a := range small {
		for _, b := range small {
			for _, c := range small {
				names = append(names, a+b+c)
			}
		}
	}
	for i := 0; i < 200000; i++ {
		names = append(names, randomName(r))
	}
	for _, in := range names {
		seg := Encode(in)
		assertSafe(t, in, seg)
		if prev, ok := seen[seg]; ok && prev != in {
			t.Fatalf("%q and %q both encode to %q", prev, in, seg)
		}
		seen[seg] = in
		if strings.Contains(seg, hashMark) {
			continue
		}
		if dec, err := Decode(seg); err != nil || dec != in {
			t.Fatalf("Decode(Encode(%q)) = %q, %v", in, dec, err)
		}
		if IsPlain(in) != (seg == in) {
			t.Fatalf("IsPlain(%q) = %v, but Encode gives %q", in, IsPlain(in), seg)
		}
		if Validate(in) == nil && seg != in {
			t.Fatalf("Validate accepts %q, which encodes to %q", in, seg)
		}
	}
	if len(seen) < 100000 {
		t.Fatalf("only %d distinct names drawn", len(seen))
	}
}

func TestEncodeIsASCII(t *testing.T) {
	for _, in := range []string{"日本語", "\u202e", "a\u0301", "\U0001F600"} {
		got := Encode(in)
		if !utf8.ValidString(got) || strings.IndexFunc(got, func(r rune) bool { return r >= 0x80 }) >= 0 {
			t.Errorf("Encode(%q) = %q is not ASCII", in, got)
		}
	}
}

func BenchmarkEncodePlain(b *testing.B) {
	for i := 0; i < b.N; i++ {
		Encode("bert-finetune")
	}
}
