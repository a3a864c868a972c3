package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The JSON schema of every command (README "JSON output"): field names are
// snake_case, the proto field names of proto/tenure/v1 where the API has
// the field (range_id, leader_id, high_water_mark); offsets, epochs, counts
// and times (*_unix_ms, *_us, *_ms) are JSON numbers. API objects (ranges,
// transitions, membership phases) are protobuf's canonical JSON mapping
// with one change: 64-bit integers are numbers, not the mapping's strings,
// like every other number tenurectl prints (protojson parsers accept
// both). A command prints one JSON document; a stream (consume, produce,
// membership changes) prints one object per line.
var protoJSON protoJSONMarshaler

type protoJSONMarshaler struct{}

// Marshal is protojson with proto names, unpopulated fields, and 64-bit
// integers as numbers, keeping the fields in their proto order.
func (protoJSONMarshaler) Marshal(m proto.Message) ([]byte, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := decodeOrdered(dec)
	if err != nil {
		return nil, err
	}
	return json.Marshal(int64Numbers(m.ProtoReflect().Descriptor(), v))
}

// ordered is a JSON object that keeps its keys' order.
type ordered struct {
	keys []string
	vals map[string]any
}

func (o *ordered) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		vb, err := json.Marshal(o.vals[k])
		if err != nil {
			return nil, err
		}
		b.Write(kb)
		b.WriteByte(':')
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// decodeOrdered decodes one JSON value, objects as *ordered.
func decodeOrdered(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		o := &ordered{vals: map[string]any{}}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil, err
			}
			k, _ := kt.(string)
			v, err := decodeOrdered(dec)
			if err != nil {
				return nil, err
			}
			o.keys, o.vals[k] = append(o.keys, k), v
		}
		_, err := dec.Token()
		return o, err
	case json.Delim('['):
		l := []any{}
		for dec.More() {
			v, err := decodeOrdered(dec)
			if err != nil {
				return nil, err
			}
			l = append(l, v)
		}
		_, err := dec.Token()
		return l, err
	}
	return tok, nil
}

// int64Numbers turns the mapping's quoted 64-bit integers of message md's
// JSON object v into numbers, recursively. Well-known types (Timestamp,
// Duration) keep their own string forms.
func int64Numbers(md protoreflect.MessageDescriptor, v any) any {
	o, ok := v.(*ordered)
	if !ok || md.FullName().Parent() == "google.protobuf" {
		return v
	}
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		name := string(fd.Name())
		fv, ok := o.vals[name]
		if !ok {
			continue
		}
		switch {
		case fd.IsMap():
			if m, ok := fv.(*ordered); ok {
				for _, k := range m.keys {
					m.vals[k] = valueNumbers(fd.MapValue(), m.vals[k])
				}
			}
		case fd.IsList():
			if l, ok := fv.([]any); ok {
				for j := range l {
					l[j] = valueNumbers(fd, l[j])
				}
			}
		default:
			o.vals[name] = valueNumbers(fd, fv)
		}
	}
	return o
}

// quotedIDs are the 64-bit fields that stay quoted strings, as in
// protobuf's mapping: identifiers drawn from the whole 64-bit range (an
// etcd lease id), not counts. As JSON numbers they lost their low digits in
// every reader that parses numbers as doubles (jq printed
// 7742710652541656470 as 7742710652541656000), and an id that reads back
// wrong names another session.
var quotedIDs = map[protoreflect.Name]bool{"session_id": true}

func valueNumbers(fd protoreflect.FieldDescriptor, v any) any {
	switch fd.Kind() {
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		if s, ok := v.(string); ok && !quotedIDs[fd.Name()] {
			return json.Number(s)
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return int64Numbers(fd.Message(), v)
	}
	return v
}

// writeProtoJSON prints one API object.
func writeProtoJSON(w io.Writer, m proto.Message) error {
	b, err := protoJSON.Marshal(m)
	if err != nil {
		return err
	}
	return writeJSON(w, json.RawMessage(b))
}

// writeProtoJSONList prints API objects as one JSON array.
func writeProtoJSONList[M proto.Message](w io.Writer, ms []M) error {
	out := make([]json.RawMessage, 0, len(ms))
	for _, m := range ms {
		b, err := protoJSON.Marshal(m)
		if err != nil {
			return err
		}
		out = append(out, b)
	}
	return writeJSON(w, out)
}

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// micros renders a duration given in microseconds, rounded for reading.
func micros(us int64) time.Duration {
	d := time.Duration(us) * time.Microsecond
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d
}

// plural is "1 record", "2 records".
func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}
