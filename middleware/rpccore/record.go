package rpccore

import (
	"encoding/binary"
	"errors"
	"net/textproto"
	"slices"
	"strconv"
	"strings"

	"github.com/idemgo/idem"
)

// Record flags.
const (
	// FlagOmitted: the response message was over MaxResponseBytes and not
	// recorded; its replays answer AlreadyExists.
	FlagOmitted = 1 << iota
	// FlagStatus: an error status (a google.rpc.Status) was recorded
	// instead of a message.
	FlagStatus
)

// Version is the first byte of every record.
const Version = 1

// ErrRecord is a record that does not decode.
var ErrRecord = errors.New("rpccore: the recorded response does not decode")

// Metadata is a call's header or trailer metadata by name: the type under
// both gRPC's metadata.MD (names in lower case) and net/http's Header
// (names in canonical form), so that either converts to it for free.
type Metadata map[string][]string

// values returns the values of lower, a name in lower case, or of canon,
// its canonical form, whichever m holds.
func (m Metadata) values(lower, canon string) []string {
	if vs, ok := m[lower]; ok {
		return vs
	}
	return m[canon]
}

// Record is a decoded record: what a call answered.
type Record struct {
	// Flags are FlagOmitted or FlagStatus, or neither for a message.
	Flags byte
	// Header and Trailer are the metadata replayed: the names of the
	// allowlist DecodeRecord was given, spelled as given there.
	Header, Trailer Metadata
	// Name is the response message's full type name; "" for a status.
	Name string
	// Body is the message's encoding (nil when omitted), or the
	// google.rpc.Status's.
	Body []byte
}

// EncodeRecord encodes what a call answered, version 1:
//
//	byte     version (1)
//	byte     flags: bit 0 message omitted (over MaxResponseBytes), bit 1 an error status
//	uvarint  number of header pairs, then each: uvarint length and bytes of the name, of the value
//	uvarint  number of trailer pairs, the same way
//	uvarint  length and bytes of the message's full type name ("" for a status)
//	rest     the message's encoding, or the google.rpc.Status's
//
// Only the metadata names in replay (lower case) are recorded, looked up
// in lower case or in canonical form; their names are written in lower
// case, as gRPC sends them, so that the gRPC and Connect front doors read
// each other's records. body is nil when flags has FlagOmitted.
func EncodeRecord(flags byte, header, trailer Metadata, replay []string, name string, body []byte) []byte {
	return append(encodeRecord(flags, header, trailer, replay, canonical(replay), name, len(body)), body...)
}

func canonical(names []string) []string {
	c := make([]string, len(names))
	for i, n := range names {
		c[i] = textproto.CanonicalMIMEHeaderKey(n)
	}
	return c
}

// encodeRecord returns a record up to its body, with room for a body of
// that size.
func encodeRecord(flags byte, header, trailer Metadata, replay, canon []string, name string, room int) []byte {
	b := make([]byte, 0, 16+len(name)+room)
	b = append(b, Version, flags)
	for _, md := range [...]Metadata{header, trailer} {
		n := 0
		for i, k := range replay {
			n += len(md.values(k, canon[i]))
		}
		b = binary.AppendUvarint(b, uint64(n))
		for i, k := range replay {
			for _, v := range md.values(k, canon[i]) {
				b = appendString(b, k)
				b = appendString(b, v)
			}
		}
	}
	return appendString(b, name)
}

// DecodeRecord decodes b, keeping only the metadata names in replay,
// compared without regard to case and spelled as replay spells them: a
// name dropped from the allowlist since the record was written is not
// replayed. A record that does not decode is ErrRecord.
func DecodeRecord(b []byte, replay []string) (*Record, error) {
	if len(b) < 2 || b[0] != Version || b[1]&^(FlagOmitted|FlagStatus) != 0 || b[1] == FlagOmitted|FlagStatus {
		return nil, ErrRecord
	}
	r := &Record{Flags: b[1]}
	b = b[2:]
	for _, md := range [...]*Metadata{&r.Header, &r.Trailer} {
		n, l := binary.Uvarint(b)
		if l <= 0 || n > uint64(len(b)) {
			return nil, ErrRecord
		}
		b = b[l:]
		for range n {
			var k, v []byte
			if k, b = consumeBytes(b); b == nil {
				return nil, ErrRecord
			}
			if v, b = consumeBytes(b); b == nil {
				return nil, ErrRecord
			}
			for _, name := range replay {
				if strings.EqualFold(name, string(k)) { // compared without a copy
					if *md == nil {
						*md = Metadata{}
					}
					(*md)[name] = append((*md)[name], string(v))
				}
			}
		}
	}
	name, rest := consumeBytes(b)
	if rest == nil {
		return nil, ErrRecord
	}
	r.Name, r.Body = string(name), rest
	return r, nil
}

// Resolution is how an operator settles a quarantined key of the gRPC or
// Connect server interceptor as done (idem.Resolver.Resolve, `idem
// resolve`): the interceptors' record of a response whose message, of the
// full type name (as "acme.orders.v1.Order"), has the wire encoding body,
// with header and trailer metadata, which a replay sends where the
// interceptor's ReplayMetadata (ReplayHeaders) lists their names. Every
// call of the key then gets that message, marked replayed, as if the
// handler had answered it. The store key is StoreKey's, of the call's
// scope and key.
//
// It needs only bytes, so that a program without protobuf (the idem
// command) builds it; the gRPC and Connect modules build it from a
// proto.Message too (idemgrpc.Resolution, idemconnect.Resolution). It
// refuses an empty name, or one that is not a full type name, since no
// replay could decode the message.
func Resolution(name string, body []byte, header, trailer Metadata) (idem.Resolution, error) {
	if !isFullName(name) {
		return idem.Resolution{}, errors.New("rpccore: Resolution: " + strconv.Quote(name) + " is not a message's full type name (package.Message)")
	}
	var names []string
	for _, md := range [...]Metadata{header, trailer} {
		for k := range md {
			names = append(names, strings.ToLower(k))
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	return idem.Resolution{Confirm: true, Result: EncodeRecord(0, header, trailer, names, name, body)}, nil
}

// isFullName reports whether s is a protobuf full name: identifiers joined
// by dots.
func isFullName(s string) bool {
	for p := range strings.SplitSeq(s, ".") {
		if !IsIdent(p) {
			return false
		}
	}
	return s != ""
}

// IsIdent reports whether s is a protobuf identifier: a letter or _, then
// letters, digits or _.
func IsIdent(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return s != ""
}

// The protobuf wire format, as much of it as the records and the answers'
// details need, written here so that the core depends on no protobuf
// package (a varint is encoding/binary's uvarint).
const (
	wireVarint  = 0
	wireFixed64 = 1
	wireBytes   = 2
	wireFixed32 = 5
)

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendField(b []byte, num int, s string) []byte {
	if s == "" {
		return b
	}
	b = binary.AppendUvarint(b, uint64(num)<<3|wireBytes)
	return appendString(b, s)
}

func appendVarintField(b []byte, num int, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = binary.AppendUvarint(b, uint64(num)<<3|wireVarint)
	return binary.AppendUvarint(b, v)
}

// consumeBytes reads a length-prefixed field value from b and returns it
// and the rest, nil when b does not hold one.
func consumeBytes(b []byte) (v, rest []byte) {
	n, l := binary.Uvarint(b)
	if l <= 0 || n > uint64(len(b)-l) {
		return nil, nil
	}
	return b[l : l+int(n)], b[l+int(n):]
}

// fields calls f with each field of the message encoded in b: its number,
// and its value (a varint's, or a length-prefixed field's bytes); fixed
// fields are passed over. It returns ErrRecord for an encoding that is not
// a message's, or f's error.
func fields(b []byte, f func(num int, v uint64, bs []byte) error) error {
	for len(b) > 0 {
		tag, l := binary.Uvarint(b)
		if l <= 0 || tag>>3 == 0 || tag>>3 > 1<<29 {
			return ErrRecord
		}
		b = b[l:]
		var v uint64
		var bs []byte
		switch tag & 7 {
		case wireVarint:
			if v, l = binary.Uvarint(b); l <= 0 {
				return ErrRecord
			}
			b = b[l:]
		case wireBytes:
			if bs, b = consumeBytes(b); b == nil {
				return ErrRecord
			}
		case wireFixed64, wireFixed32:
			n := 8
			if tag&7 == wireFixed32 {
				n = 4
			}
			if len(b) < n {
				return ErrRecord
			}
			b = b[n:]
			continue
		default:
			return ErrRecord
		}
		if err := f(int(tag>>3), v, bs); err != nil {
			return err
		}
	}
	return nil
}
