package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// API objects (ranges, transitions) are printed in protobuf's canonical JSON
// mapping with the field names of proto/tenure/v1, so scripts see exactly
// the API's shape (64-bit integers are strings there, as the mapping says).
var protoJSON = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

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
