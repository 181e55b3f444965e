package pgwire

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

type seen struct{ events []string }

func (s *seen) message(typ byte, body []byte) {
	s.events = append(s.events, string(rune(typ))+":"+string(body))
}
func (s *seen) rawByte(b byte) { s.events = append(s.events, "raw:"+string(rune(b))) }

func typed(typ byte, body string) []byte {
	b := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(4+len(body)))
	return append(b, body...)
}

// A message may be cut anywhere between reads; the framer must find the
// same messages whether the stream comes whole or one byte at a time.
func TestFramerFindsMessagesAcrossAnySplit(t *testing.T) {
	t.Parallel()
	var stream []byte
	stream = append(stream, typed('Q', "SELECT 1\x00")...)
	stream = append(stream, typed('S', "")...)
	stream = append(stream, typed('P', "s1\x00SELECT $1\x00\x00\x00")...)
	stream = append(stream, typed('E', "\x00\x00\x00\x00\x00")...)

	keepAll := func(byte) bool { return true }
	var whole seen
	f := framer{keep: keepAll}
	if err := f.feed(stream, &whole); err != nil {
		t.Fatal(err)
	}
	want := []string{"Q:SELECT 1\x00", "S:", "P:s1\x00SELECT $1\x00\x00\x00", "E:\x00\x00\x00\x00\x00"}
	if diff := cmp.Diff(want, whole.events); diff != "" {
		t.Fatalf("whole stream (-want +got):\n%s", diff)
	}
	for _, size := range []int{1, 2, 3, 5, 7} {
		var split seen
		f := framer{keep: keepAll}
		for i := 0; i < len(stream); i += size {
			if err := f.feed(stream[i:min(i+size, len(stream))], &split); err != nil {
				t.Fatal(err)
			}
		}
		if diff := cmp.Diff(want, split.events); diff != "" {
			t.Errorf("reads of %d bytes (-want +got):\n%s", size, diff)
		}
	}
}

func TestFramerUntypedAndRaw(t *testing.T) {
	t.Parallel()
	ssl := []byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f} // SSLRequest
	var got seen
	f := framer{untyped: true, keep: func(byte) bool { return true }}
	if err := f.feed(ssl, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.events) != 1 || got.events[0] != "\x00:\x04\xd2\x16\x2f" {
		t.Fatalf("events %q", got.events)
	}
	f = framer{raw: 1, keep: func(byte) bool { return false }}
	got = seen{}
	if err := f.feed(append([]byte{'N'}, typed('Z', "I")...), &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"raw:N", "Z:"}, got.events); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestFramerRejectsImpossibleLength(t *testing.T) {
	t.Parallel()
	f := framer{keep: func(byte) bool { return false }}
	if err := f.feed([]byte{'Q', 0, 0, 0, 3}, &seen{}); !errors.Is(err, errFraming) {
		t.Errorf("err = %v, want errFraming", err)
	}
}
