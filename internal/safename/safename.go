// Package safename turns an arbitrary name — a Nomad job ID, namespace, task
// group, a submission stamp — into one segment that is safe both as a file
// name under a directory (the checkpoint root) and as one segment of a
// Consul KV key (which the Consul API client puts into the URL path).
//
// Nomad refuses little in a job ID: it must not be empty and must hold no
// space and no NUL; "../../x", "a/b", "a%2Fb", "..", tabs and newlines are all
// valid job IDs. Joined into a path raw, such a name walks out of the
// checkpoint root; put into a Consul key raw, its "." and ".." segments are
// cleaned away by the HTTP server's router (a redirect, then a 404).
//
// # Encoding
//
// Encode keeps the bytes A-Z a-z 0-9 '-' '_' and '.' (except a '.' in first
// position) and writes every other byte, UTF-8 or not, as '~' and two
// upper-case hex digits: "a/b" is "a~2Fb", ".." is "~2E.", "~" is "~7E". So
//
//   - an ordinary name such as "bert-finetune", "train_1", "default" or
//     "1764490000" is its own encoding: existing checkpoint directories and
//     rendezvous keys keep their layout;
//   - an encoding is never empty, never "." or "..", never starts with '.',
//     and holds no '/', '\\', NUL, control character, space, non-ASCII
//     byte, or any of '%', '?', '#' that a URL path would need to escape;
//   - it is injective: each byte has exactly one code word and no code word
//     is a prefix of another ('~' is not a kept byte), so Decode reverses it.
//
// The empty name encodes as the lone "~", which no other name produces.
//
// An encoding longer than MaxLen bytes is shortened to a readable prefix of
// it (cut between code words), "~~", and the SHA-256 of the name in hex:
// "~~" never occurs in an unshortened encoding ('~' is always followed by a
// hex digit there), so a shortened encoding equals no unshortened one, and
// two shortened ones are equal only if their names' SHA-256 are. Shortened
// encodings cannot be decoded (ErrHashed).
//
// The encoding preserves case: on a case-insensitive file system "Bert"
// and "bert" share a directory. Nomad, Consul and the Linux file systems
// gpujob checkpoints to are case-sensitive; folding case would change the
// layout of every existing name with a capital letter.
package safename

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// MaxLen is the longest encoding, in bytes: well under the 255-byte file
// name limit of Linux file systems, and short enough that a Consul key of
// a few such segments stays readable.
const MaxLen = 128

// escape starts an escaped byte; hashMark separates a shortened encoding's
// prefix from its hash.
const (
	escape   = '~'
	hashMark = "~~"
	// hashLen is the hex digits of a SHA-256.
	hashLen = 2 * sha256.Size
	// prefixLen is the most of the encoding a shortened one keeps.
	prefixLen = MaxLen - len(hashMark) - hashLen
	// empty is the encoding of "".
	empty = "~"
)

// ErrHashed is Decode's error for a shortened encoding.
var ErrHashed = errors.New("safename: a shortened (hashed) encoding cannot be decoded")

// kept reports whether b stands for itself at position i of an encoding.
func kept(b byte, i int) bool {
	switch {
	case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9', b == '-', b == '_':
		return true
	case b == '.':
		// A leading '.' would allow "." and ".." and hide the directory.
		return i > 0
	}
	return false
}

// IsPlain reports whether s is its own encoding: non-empty, at most MaxLen
// bytes, only kept bytes. It does not allocate.
func IsPlain(s string) bool {
	if s == "" || len(s) > MaxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !kept(s[i], i) {
			return false
		}
	}
	return true
}

const hexDigits = "0123456789ABCDEF"

// Encode returns s as one safe path and key segment; see the package
// documentation.
func Encode(s string) string {
	if IsPlain(s) {
		return s
	}
	if s == "" {
		return empty
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		if c := s[i]; kept(c, i) {
			b.WriteByte(c)
		} else {
			b.WriteByte(escape)
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&0xf])
		}
	}
	if b.Len() <= MaxLen {
		return b.String()
	}
	enc := b.String()
	// Cut between code words: never leave half of a "~XX".
	cut := prefixLen
	if i := strings.LastIndexByte(enc[:cut], escape); i >= 0 && i+3 > cut {
		cut = i
	}
	sum := sha256.Sum256([]byte(s))
	return enc[:cut] + hashMark + hex.EncodeToString(sum[:])
}

// Decode reverses Encode. It refuses a shortened encoding (ErrHashed) and
// anything Encode does not produce, so Encode(Decode(seg)) == seg whenever
// Decode succeeds.
func Decode(seg string) (string, error) {
	if seg == empty {
		return "", nil
	}
	if strings.Contains(seg, hashMark) {
		return "", ErrHashed
	}
	if seg == "" || len(seg) > MaxLen {
		return "", fmt.Errorf("safename: %q is not an encoding: its length must be 1 to %d", seg, MaxLen)
	}
	out := make([]byte, 0, len(seg))
	for i := 0; i < len(seg); {
		c := seg[i]
		if c != escape {
			if !kept(c, len(out)) {
				return "", fmt.Errorf("safename: %q is not an encoding: byte %d (%q) must be escaped", seg, i, c)
			}
			out = append(out, c)
			i++
			continue
		}
		hi, lo := -1, -1
		if i+2 < len(seg) {
			hi, lo = strings.IndexByte(hexDigits, seg[i+1]), strings.IndexByte(hexDigits, seg[i+2])
		}
		if hi < 0 || lo < 0 {
			return "", fmt.Errorf("safename: %q is not an encoding: '~' at byte %d needs two upper-case hex digits", seg, i)
		}
		d := byte(hi<<4 | lo)
		if kept(d, len(out)) {
			return "", fmt.Errorf("safename: %q is not an encoding: byte %d escapes %q, which stands for itself", seg, i, d)
		}
		out = append(out, d)
		i += 3
	}
	return string(out), nil
}

// Allowed says in words what Validate accepts, for error messages.
const Allowed = "1 to 128 ASCII letters, digits, '.', '_' and '-', starting with a letter or a digit"

// Validate is the rule for the names gpujob itself writes into a job (the
// train block's name, which becomes the Nomad job ID): stricter than Nomad,
// which refuses only empty IDs, spaces and NULs, so that the name is its
// own encoding — the checkpoint directory and the rendezvous keys carry it
// unchanged — and reads as one word on a command line (no leading '-',
// no shell metacharacters). The error says what is wrong; Allowed says
// what is right.
func Validate(name string) error {
	switch {
	case name == "":
		return errors.New("is empty")
	case len(name) > MaxLen:
		return fmt.Errorf("is %d bytes long; the most is %d", len(name), MaxLen)
	}
	if c := name[0]; !isAlnum(c) {
		return fmt.Errorf("starts with %s", describe(name, 0))
	}
	for i := 1; i < len(name); i++ {
		if c := name[i]; !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return fmt.Errorf("contains %s at byte %d", describe(name, i), i)
		}
	}
	return nil
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// describe names the character at byte i of s: quoted, with a word for
// the ones a quote shows badly.
func describe(s string, i int) string {
	switch c := s[i]; {
	case c == ' ':
		return "a space"
	case c == '/':
		return "'/' (a path separator)"
	case c == '.':
		return "'.'"
	case c < 0x20 || c == 0x7f:
		return fmt.Sprintf("the control character %q", c)
	case c >= 0x80:
		r := []rune(s[i:])[0]
		return fmt.Sprintf("the non-ASCII character %q", r)
	default:
		return fmt.Sprintf("%q", c)
	}
}
