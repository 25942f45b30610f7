package idemconnect

import (
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
)

// Record flags, as the gRPC module's.
const (
	flagOmitted = 1 << iota // the response message was over MaxResponseBytes and not recorded
	flagStatus              // an error status was recorded instead of a message
)

// recordVersion is the first byte of every record this package writes.
const recordVersion = 1

// errRecord is a record that does not decode.
var errRecord = errors.New("idemconnect: the recorded response does not decode")

// encodeRecord encodes what a call answered: the replayed header and
// trailer fields, and either its response message (by type name and
// encoding) or its error status (a google.rpc.Status). body is nil when
// flagOmitted is set. Header names are recorded in lower case, as gRPC
// metadata keys, so that the gRPC module reads the record alike.
func encodeRecord(flags byte, header, trailer http.Header, replay []string, name protoreflect.FullName, body []byte) []byte {
	b := make([]byte, 0, 16+len(name)+len(body))
	b = append(b, recordVersion, flags)
	for _, h := range [...]http.Header{header, trailer} {
		n := 0
		for _, k := range replay {
			n += len(h.Values(k))
		}
		b = protowire.AppendVarint(b, uint64(n))
		for _, k := range replay {
			for _, v := range h.Values(k) {
				b = protowire.AppendString(b, k)
				b = protowire.AppendString(b, v)
			}
		}
	}
	b = protowire.AppendString(b, string(name))
	return append(b, body...)
}

// record is a decoded record.
type record struct {
	flags           byte
	header, trailer http.Header // today's allowlist only
	name            string
	body            []byte
}

// decodeRecord decodes b, keeping only the header names in replay: a name
// dropped from the allowlist since the record was written is not
// replayed.
func decodeRecord(b []byte, replay []string) (*record, error) {
	if len(b) < 2 || b[0] != recordVersion || b[1]&^(flagOmitted|flagStatus) != 0 || b[1] == flagOmitted|flagStatus {
		return nil, errRecord
	}
	r := &record{flags: b[1], header: http.Header{}, trailer: http.Header{}}
	b = b[2:]
	for _, h := range [...]http.Header{r.header, r.trailer} {
		n, l := protowire.ConsumeVarint(b)
		if l < 0 || n > uint64(len(b)) {
			return nil, errRecord
		}
		b = b[l:]
		for range n {
			k, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return nil, errRecord
			}
			b = b[l:]
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return nil, errRecord
			}
			b = b[l:]
			for _, name := range replay {
				if strings.EqualFold(name, string(k)) {
					h.Add(name, string(v))
				}
			}
		}
	}
	name, l := protowire.ConsumeBytes(b)
	if l < 0 {
		return nil, errRecord
	}
	r.name, r.body = string(name), b[l:]
	return r, nil
}

// message decodes a recorded response message: a new message of its type,
// from the global registry where generated code registers every type.
func (r *record) message() (proto.Message, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(r.name))
	if err != nil {
		return nil, errors.Join(errRecord, err)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(r.body, m); err != nil {
		return nil, errors.Join(errRecord, err)
	}
	return m, nil
}

// The fields of google.rpc.Status and google.protobuf.Any, written by hand
// so that the record is the gRPC module's without a dependency on
// genproto's status package.
const (
	statusCode    protowire.Number = 1
	statusMessage protowire.Number = 2
	statusDetails protowire.Number = 3
	anyTypeURL    protowire.Number = 1
	anyValue      protowire.Number = 2
)

// encodeStatus encodes a *connect.Error as a google.rpc.Status.
func encodeStatus(code connect.Code, msg string, details []*connect.ErrorDetail) []byte {
	var b []byte
	b = protowire.AppendTag(b, statusCode, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(code))
	if msg != "" {
		b = protowire.AppendTag(b, statusMessage, protowire.BytesType)
		b = protowire.AppendString(b, msg)
	}
	for _, d := range details {
		var a []byte
		a = protowire.AppendTag(a, anyTypeURL, protowire.BytesType)
		a = protowire.AppendString(a, "type.googleapis.com/"+d.Type())
		a = protowire.AppendTag(a, anyValue, protowire.BytesType)
		a = protowire.AppendBytes(a, d.Bytes())
		b = protowire.AppendTag(b, statusDetails, protowire.BytesType)
		b = protowire.AppendBytes(b, a)
	}
	return b
}

// status decodes a recorded google.rpc.Status into a *connect.Error.
func (r *record) status() (*connect.Error, error) {
	var (
		code    uint64
		msg     string
		details []*connect.ErrorDetail
	)
	b := r.body
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return nil, errRecord
		}
		b = b[l:]
		switch {
		case num == statusCode && typ == protowire.VarintType:
			code, l = protowire.ConsumeVarint(b)
		case num == statusMessage && typ == protowire.BytesType:
			var v []byte
			v, l = protowire.ConsumeBytes(b)
			msg = string(v)
		case num == statusDetails && typ == protowire.BytesType:
			var v []byte
			if v, l = protowire.ConsumeBytes(b); l >= 0 {
				a := new(anypb.Any)
				if err := proto.Unmarshal(v, a); err != nil {
					return nil, errors.Join(errRecord, err)
				}
				d, err := connect.NewErrorDetail(a)
				if err != nil {
					return nil, errors.Join(errRecord, err)
				}
				details = append(details, d)
			}
		default:
			l = protowire.ConsumeFieldValue(num, typ, b)
		}
		if l < 0 {
			return nil, errRecord
		}
		b = b[l:]
	}
	if code == 0 || code > 1<<31 {
		return nil, errRecord // a recorded status is an error's
	}
	e := connect.NewError(connect.Code(code), errors.New(msg))
	for _, d := range details {
		e.AddDetail(d)
	}
	return e, nil
}
