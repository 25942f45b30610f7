package rpccore

import (
	"encoding/binary"
	"time"
)

// Code is a status code, as google.rpc.Code numbers it: gRPC's codes.Code
// and Connect's connect.Code are both these numbers (0 is OK, a success).
type Code uint32

// The codes the core answers with or looks for.
const (
	OK                 Code = 0
	Canceled           Code = 1
	InvalidArgument    Code = 3
	DeadlineExceeded   Code = 4
	AlreadyExists      Code = 6
	FailedPrecondition Code = 9
	Aborted            Code = 10
	Unimplemented      Code = 12
	Internal           Code = 13
	Unavailable        Code = 14
	Unauthenticated    Code = 16
)

// Status is an error answer as google.rpc.Status holds it; each front door
// turns it into its framework's error (a gRPC status, a *connect.Error).
type Status struct {
	Code    Code
	Message string
	Details []Detail
}

// Detail is one of a Status's details: a google.protobuf.Any.
type Detail struct {
	// TypeURL is the detail's type URL, "type.googleapis.com/" and its
	// message's full type name.
	TypeURL string
	// Value is the message's encoding.
	Value []byte
}

// TypeURLPrefix is the prefix of every Detail's TypeURL.
const TypeURLPrefix = "type.googleapis.com/"

// Encode returns the google.rpc.Status encoding of s, byte for byte what
// protobuf's Marshal makes of it.
func (s *Status) Encode() []byte {
	b := appendVarintField(nil, 1, uint64(s.Code))
	b = appendField(b, 2, s.Message)
	for _, d := range s.Details {
		a := appendField(nil, 1, d.TypeURL)
		a = appendField(a, 2, string(d.Value))
		b = appendField(b, 3, string(a))
	}
	return b
}

// ParseStatus decodes a google.rpc.Status encoding; it is ErrRecord when
// b is not one, or holds no error (code 0).
func ParseStatus(b []byte) (*Status, error) {
	s := &Status{}
	err := fields(b, func(num int, v uint64, bs []byte) error {
		switch num {
		case 1:
			s.Code = Code(v)
			if v > 1<<31 {
				return ErrRecord
			}
		case 2:
			s.Message = string(bs)
		case 3:
			var d Detail
			if err := fields(bs, func(num int, _ uint64, bs []byte) error {
				switch num {
				case 1:
					d.TypeURL = string(bs)
				case 2:
					d.Value = bs
				}
				return nil
			}); err != nil {
				return err
			}
			s.Details = append(s.Details, d)
		}
		return nil
	})
	if err != nil || s.Code == OK {
		return nil, ErrRecord // a recorded status is an error's
	}
	return s, nil
}

// The details the core adds to its answers, encoded by hand as
// google.rpc.ErrorInfo, RetryInfo and PreconditionFailure.

func errorInfo(reason, domain, key string) Detail {
	b := appendField(nil, 1, reason)
	b = appendField(b, 2, domain)
	if key != "" {
		e := appendField(nil, 1, "idempotency_key")
		e = appendField(e, 2, key)
		b = appendField(b, 3, string(e))
	}
	return Detail{TypeURL: TypeURLPrefix + "google.rpc.ErrorInfo", Value: b}
}

func retryInfo(d time.Duration) Detail {
	dur := appendVarintField(nil, 1, uint64(d/time.Second))
	dur = appendVarintField(dur, 2, uint64(d%time.Second))
	b := binaryField(1, dur)
	return Detail{TypeURL: TypeURLPrefix + "google.rpc.RetryInfo", Value: b}
}

func preconditionFailure(typ, subject, desc string) Detail {
	v := appendField(nil, 1, typ)
	v = appendField(v, 2, subject)
	v = appendField(v, 3, desc)
	return Detail{TypeURL: TypeURLPrefix + "google.rpc.PreconditionFailure", Value: binaryField(1, v)}
}

// binaryField is a message of one length-prefixed field, present even when
// empty (a RetryInfo of a zero delay still says: retry).
func binaryField(num int, v []byte) []byte {
	b := binary.AppendUvarint(nil, uint64(num)<<3|wireBytes)
	return appendString(b, string(v))
}

// RetryDelay returns the delay of a google.rpc.RetryInfo among details,
// within 0 and 1h, and false when there is none.
func RetryDelay(details []Detail) (time.Duration, bool) {
	for _, d := range details {
		if d.TypeURL != TypeURLPrefix+"google.rpc.RetryInfo" {
			continue
		}
		var secs, nanos int64
		found := false
		err := fields(d.Value, func(num int, _ uint64, bs []byte) error {
			if num != 1 {
				return nil
			}
			found = true
			return fields(bs, func(num int, v uint64, _ []byte) error {
				switch num {
				case 1:
					secs = int64(v)
				case 2:
					nanos = int64(int32(v))
				}
				return nil
			})
		})
		if err != nil || !found {
			continue
		}
		if secs > 3600 {
			return time.Hour, true
		}
		return max(min(time.Duration(secs)*time.Second+time.Duration(nanos), time.Hour), 0), true
	}
	return 0, false
}
