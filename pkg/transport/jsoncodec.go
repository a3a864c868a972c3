package transport

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// jsonCodec is connect-go's JSON codec (protobuf's JSON mapping, unknown
// fields ignored) with one difference: a request it cannot read is
// refused in the API's words. connect-go's says
//
//	unmarshal message: unmarshal into *tenurev1.GetRangeRequest: proto: (line 1:13): invalid value for string field rangeId: 5
//
// naming the Go type, and so the Go package, behind the API; a caller in
// another language knows the message as tenure.v1.GetRangeRequest, which
// is what this one names:
//
//	unmarshal message: invalid JSON for tenure.v1.GetRangeRequest: (line 1:13): invalid value for string field rangeId: 5
//
// Handlers only (HandlerOptions): tenure's own clients send binary
// protobuf.
type jsonCodec struct{ name string }

var _ connect.Codec = jsonCodec{}

func (c jsonCodec) Name() string { return c.name }

func (jsonCodec) IsBinary() bool { return false }

func (jsonCodec) Marshal(message any) ([]byte, error) {
	m, ok := message.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", message)
	}
	return protojson.MarshalOptions{}.Marshal(m)
}

func (jsonCodec) MarshalAppend(dst []byte, message any) ([]byte, error) {
	m, ok := message.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", message)
	}
	return protojson.MarshalOptions{}.MarshalAppend(dst, m)
}

// MarshalStable is Marshal without protojson's deliberately unstable
// whitespace, as connect-go's codec does it.
func (c jsonCodec) MarshalStable(message any) ([]byte, error) {
	b, err := c.Marshal(message)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func (jsonCodec) Unmarshal(data []byte, message any) error {
	m, ok := message.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a protobuf message", message)
	}
	name := m.ProtoReflect().Descriptor().FullName()
	if len(data) == 0 {
		return fmt.Errorf("empty JSON for %s: send {} for a message with every field at its default", name)
	}
	// Ignore unknown fields, as connect-go does: a client built against a
	// newer schema can still call.
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, m); err != nil {
		// protobuf-go begins its errors with "proto:" and, on purpose,
		// a space or a no-break space at random.
		msg := strings.TrimLeft(strings.TrimPrefix(err.Error(), "proto:"), " \u00a0")
		return errors.New("invalid JSON for " + string(name) + ": " + msg)
	}
	return nil
}
