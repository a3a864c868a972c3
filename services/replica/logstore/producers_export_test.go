package logstore

// ProducerCount is how many producers range r's dedupe table holds (0
// before it is built).
func (r *Range) ProducerCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.producers == nil {
		return 0
	}
	return len(r.producers.m)
}
