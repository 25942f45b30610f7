package idemgrpc

import (
	"errors"
	"strings"
	"sync"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Record flags.
const (
	flagOmitted = 1 << iota // the response message was over MaxResponseBytes and not recorded
	flagStatus              // an error status was recorded instead of a message
)

// recordVersion is the first byte of every record this package writes.
const recordVersion = 1

// errRecord is a record that does not decode.
var errRecord = errors.New("idemgrpc: the recorded response does not decode")

// encodeRecord encodes what a call answered: the allowlisted header and
// trailer metadata, and either its response message (by type name and
// encoding) or its error status. body is nil when omitted is set.
func encodeRecord(flags byte, header, trailer metadata.MD, replay []string, name protoreflect.FullName, body []byte) []byte {
	b := make([]byte, 0, 16+len(name)+len(body))
	b = append(b, recordVersion, flags)
	for _, md := range [...]metadata.MD{header, trailer} {
		n := 0
		for _, k := range replay {
			n += len(md[k])
		}
		b = protowire.AppendVarint(b, uint64(n))
		for _, k := range replay {
			for _, v := range md[k] {
				b = protowire.AppendBytes(b, []byte(k))
				b = protowire.AppendBytes(b, []byte(v))
			}
		}
	}
	b = protowire.AppendBytes(b, []byte(name))
	return append(b, body...)
}

// record is a decoded record.
type record struct {
	flags           byte
	header, trailer metadata.MD // today's allowlist only
	name            string
	body            []byte
}

// decodeRecord decodes b, keeping only the metadata keys in replay: a key
// dropped from the allowlist since the record was written is not replayed.
func decodeRecord(b []byte, replay []string) (*record, error) {
	if len(b) < 2 || b[0] != recordVersion || b[1]&^(flagOmitted|flagStatus) != 0 {
		return nil, errRecord
	}
	r := &record{flags: b[1]}
	b = b[2:]
	for i := range 2 {
		n, l := protowire.ConsumeVarint(b)
		if l < 0 || n > uint64(len(b)) {
			return nil, errRecord
		}
		b = b[l:]
		var md metadata.MD
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
				if name == string(k) { // compared without a copy
					if md == nil {
						md = metadata.MD{}
					}
					md[name] = append(md[name], string(v))
				}
			}
		}
		if i == 0 {
			r.header = md
		} else {
			r.trailer = md
		}
	}
	name, l := protowire.ConsumeBytes(b)
	if l < 0 {
		return nil, errRecord
	}
	r.name, r.body = string(name), b[l:]
	if r.flags&flagStatus != 0 && r.flags&flagOmitted != 0 {
		return nil, errRecord
	}
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

// status decodes a recorded error status.
func (r *record) status() (*spb.Status, error) {
	s := new(spb.Status)
	if err := proto.Unmarshal(r.body, s); err != nil {
		return nil, errors.Join(errRecord, err)
	}
	return s, nil
}

// capture is the grpc.ServerTransportStream a covered handler runs with:
// it passes each call on to the call's own stream and keeps a copy of the
// metadata the handler sets, for the record.
type capture struct {
	grpc.ServerTransportStream // the call's own; nil when the interceptor is called without one
	method                     string

	mu              sync.Mutex // a handler may set metadata from goroutines of its own
	header, trailer metadata.MD
}

// kept returns the metadata the handler set.
func (c *capture) kept() (header, trailer metadata.MD) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.header, c.trailer
}

// Method returns the call's full method name.
func (c *capture) Method() string { return c.method }

// SetHeader keeps md and passes it on.
func (c *capture) SetHeader(md metadata.MD) error {
	c.mu.Lock()
	c.header = join(c.header, md)
	c.mu.Unlock()
	if c.ServerTransportStream == nil {
		return nil
	}
	return c.ServerTransportStream.SetHeader(md)
}

// SendHeader keeps md and passes it on.
func (c *capture) SendHeader(md metadata.MD) error {
	c.mu.Lock()
	c.header = join(c.header, md)
	c.mu.Unlock()
	if c.ServerTransportStream == nil {
		return nil
	}
	return c.ServerTransportStream.SendHeader(md)
}

// SetTrailer keeps md and passes it on.
func (c *capture) SetTrailer(md metadata.MD) error {
	c.mu.Lock()
	c.trailer = join(c.trailer, md)
	c.mu.Unlock()
	if c.ServerTransportStream == nil {
		return nil
	}
	return c.ServerTransportStream.SetTrailer(md)
}

// join appends md's values to dst's, keys in lower case as gRPC sends them.
func join(dst, md metadata.MD) metadata.MD {
	if dst == nil {
		dst = metadata.MD{}
	}
	for k, vs := range md {
		k = strings.ToLower(k)
		dst[k] = append(dst[k], vs...)
	}
	return dst
}
