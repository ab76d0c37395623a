// Command checker judges a recorded history of rlog operations with Porcupine, an
// independent linearizability checker, against a sequential model of a log.
//
// The history is JSON lines, one completed operation per line:
//
//	{"process":0,"f":"append","values":["a","b"],"invoke":10,"complete":25,"result":"ok","position":7}
//	{"process":1,"f":"read","from":null,"invoke":12,"complete":30,"result":"ok","entries":[[7,"a"],[8,"b"]]}
//
// Times are nanoseconds on one monotonic clock. `result` is "ok" (completed), "fail" (it
// certainly did not happen: dropped) or "info" (an append whose outcome is unknown: it may
// or may not have happened, so it stays open until the end of the history). Optional
// fields `endpoint` and `error` are shown in the visualization.
//
// The model: the state is the log's APPEND entries, (position, value) in position order.
//
//   - append(values) -> p: the values land at p, p+1, ...; legal iff p is past every
//     position in the log (positions only grow; gaps are no-op entries a new leader writes).
//   - read(from) -> entries: legal iff the entries are exactly the log's entries at
//     positions >= from (all of them, from the beginning, when from is null): a read must
//     see every append linearized before it and nothing else.
//
// Append kinds ("append", "append-idempotent", "append-epoch", "append-if-next") are all
// appends to the model; an ok append-if-next is legal only at the position it named
// (`if_next`). "take-epoch" and "read-min-position" (a stale read) are not linearizable
// operations of this model: they are left out (the recorder checks them directly), though
// what a read-min-position returned still places unknown appends.
//
// An unknown append some read returned (any of its values) is given the position that read
// implies as its output; one no read returned is a no-op wherever it is linearized (nothing
// later shows it).
//
// Exit status: 0 linearizable, 1 not linearizable, 2 bad input or usage, 3 the check timed
// out (unknown).
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// record is one line of the history file.
type record struct {
	Process   *int                 `json:"process"`
	F         string               `json:"f"`
	Values    []string             `json:"values"`
	From      *int64               `json:"from"`
	Invoke    *int64               `json:"invoke"`
	Complete  *int64               `json:"complete"`
	Result    string               `json:"result"`
	Position  *int64               `json:"position"`
	Positions []int64              `json:"positions"` // every value's position (checked by the recorder)
	Entries   [][2]json.RawMessage `json:"entries"`
	IfNext    *int64               `json:"if_next"`
	Epoch     *int64               `json:"epoch"`        // append-epoch, take-epoch (checked by the recorder)
	MinPos    *int64               `json:"min_position"` // read-min-position (checked by the recorder)
	Endpoint  string               `json:"endpoint"`
	Error     string               `json:"error"`
}

type entry struct {
	Position int64
	Value    string
}

type appendInput struct {
	Values []string
	IfNext *int64 // append-if-next: the position its first value must land at
}

type appendOutput struct {
	Position int64
	Known    bool // false: an unknown append no read ever showed
}

type readInput struct{ From *int64 }

type readOutput struct{ Entries []entry }

type metadata struct {
	Endpoint string
	Error    string
	Unknown  bool
}

// logState is immutable: Step returns a new one.
type logState struct {
	Entries []entry
	Hash    uint64
}

func hashEntries(entries []entry) uint64 {
	h := fnv.New64a()
	for _, e := range entries {
		fmt.Fprintf(h, "%d=%s;", e.Position, e.Value)
	}
	return h.Sum64()
}

func (s logState) last() int64 {
	if len(s.Entries) == 0 {
		return -1
	}
	return s.Entries[len(s.Entries)-1].Position
}

func (s logState) suffix(from *int64) []entry {
	if from == nil {
		return s.Entries
	}
	i := sort.Search(len(s.Entries), func(i int) bool { return s.Entries[i].Position >= *from })
	return s.Entries[i:]
}

func sameEntries(a, b []entry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func step(state, input, output interface{}) (bool, interface{}) {
	s := state.(logState)
	switch in := input.(type) {
	case appendInput:
		out := output.(appendOutput)
		if !out.Known {
			return true, s
		}
		if out.Position <= s.last() || (in.IfNext != nil && out.Position != *in.IfNext) {
			return false, s
		}
		entries := make([]entry, len(s.Entries), len(s.Entries)+len(in.Values))
		copy(entries, s.Entries)
		for i, v := range in.Values {
			entries = append(entries, entry{out.Position + int64(i), v})
		}
		return true, logState{entries, hashEntries(entries)}
	case readInput:
		return sameEntries(s.suffix(in.From), output.(readOutput).Entries), s
	}
	return false, s
}

func describeEntries(entries []entry) string {
	const limit = 12
	parts := make([]string, 0, limit+1)
	for i, e := range entries {
		if len(entries) > limit && i == limit/2 {
			parts = append(parts, fmt.Sprintf("... %d more ...", len(entries)-limit))
		}
		if len(entries) > limit && i >= limit/2 && i < len(entries)-limit/2 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%d:%s", e.Position, e.Value))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

var logModel = porcupine.Model{
	Init: func() interface{} { return logState{nil, hashEntries(nil)} },
	Step: step,
	Equal: func(a, b interface{}) bool {
		x, y := a.(logState), b.(logState)
		return x.Hash == y.Hash && sameEntries(x.Entries, y.Entries)
	},
	Hash: func(state interface{}) uint64 { return state.(logState).Hash },
	DescribeOperation: func(input, output interface{}) string {
		switch in := input.(type) {
		case appendInput:
			out := output.(appendOutput)
			if !out.Known {
				return fmt.Sprintf("append(%s) -> ? (never seen)", strings.Join(in.Values, ","))
			}
			return fmt.Sprintf("append(%s) -> %d", strings.Join(in.Values, ","), out.Position)
		case readInput:
			from := "begin"
			if in.From != nil {
				from = fmt.Sprint(*in.From)
			}
			out := output.(readOutput)
			return fmt.Sprintf("read(%s) -> %d entries %s", from, len(out.Entries), describeEntries(out.Entries))
		}
		return "?"
	},
	DescribeState: func(state interface{}) string {
		s := state.(logState)
		return fmt.Sprintf("%d entries %s", len(s.Entries), describeEntries(s.Entries))
	},
	DescribeOperationMetadata: func(info interface{}) string {
		m, ok := info.(metadata)
		if !ok {
			return ""
		}
		text := "endpoint " + m.Endpoint
		if m.Unknown {
			text += "; outcome unknown: " + m.Error
		}
		return text
	},
}

// parseHistory reads the JSON lines into Porcupine operations. Failed operations are
// dropped; unknown appends get their position from the reads and return after everything.
func parseHistory(r io.Reader) ([]porcupine.Operation, summary, error) {
	var sum summary
	var records []record
	scanner := bufio.NewScanner(r)
	scanner.Buffer(make([]byte, 1024*1024), 256*1024*1024)
	line := 0
	for scanner.Scan() {
		line++
		text := strings.TrimSpace(scanner.Text())
		if text == "" {
			continue
		}
		var rec record
		decoder := json.NewDecoder(strings.NewReader(text))
		decoder.DisallowUnknownFields()
		if err := decoder.Decode(&rec); err != nil {
			return nil, sum, fmt.Errorf("line %d: %v", line, err)
		}
		if err := validate(rec); err != nil {
			return nil, sum, fmt.Errorf("line %d: %v", line, err)
		}
		records = append(records, rec)
	}
	if err := scanner.Err(); err != nil {
		return nil, sum, err
	}

	// Where every value was read: an unknown append's position, if it happened.
	seenAt := map[string]int64{}
	reads := make([][]entry, len(records))
	var maxTime int64
	for i, rec := range records {
		if *rec.Complete > maxTime {
			maxTime = *rec.Complete
		}
		if !isRead(rec.F) || rec.Result != "ok" {
			continue
		}
		entries, err := parseEntries(rec.Entries)
		if err != nil {
			return nil, sum, fmt.Errorf("record %d: %v", i+1, err)
		}
		reads[i] = entries
		for _, e := range entries {
			if _, ok := seenAt[e.Value]; !ok {
				seenAt[e.Value] = e.Position
			}
		}
	}

	// Porcupine's visualization wants each client's operations one after another; a
	// process whose append stayed open continues under a new id, as in Jepsen.
	ids := map[int]int{}
	next := 0
	idOf := func(process int) int {
		if id, ok := ids[process]; ok {
			return id
		}
		ids[process] = next
		next++
		return ids[process]
	}
	var ops []porcupine.Operation
	for i, rec := range records {
		if rec.Result == "fail" {
			sum.Failed++
			continue
		}
		op := porcupine.Operation{
			ClientId: idOf(*rec.Process),
			Call:     *rec.Invoke,
			Return:   *rec.Complete,
			Metadata: metadata{Endpoint: rec.Endpoint, Error: rec.Error, Unknown: rec.Result == "info"},
		}
		if rec.F == "take-epoch" || rec.F == "read-min-position" {
			sum.Skipped++ // not linearizable operations of the log model: checked directly
			continue
		}
		switch {
		case isAppend(rec.F):
			sum.Appends++
			op.Input = appendInput{rec.Values, rec.IfNext}
			if rec.Result == "ok" {
				op.Output = appendOutput{*rec.Position, true}
			} else {
				sum.Unknown++
				// Any value of the batch will do: a read from a position may show
				// only its tail.
				op.Output = appendOutput{}
				for k, v := range rec.Values {
					if position, seen := seenAt[v]; seen {
						op.Output = appendOutput{position - int64(k), true}
						break
					}
				}
				op.Return = maxTime + 1
				delete(ids, *rec.Process)
			}
		case rec.F == "read":
			sum.Reads++
			op.Input = readInput{rec.From}
			op.Output = readOutput{reads[i]}
		}
		ops = append(ops, op)
	}
	sum.Operations = len(ops)
	return ops, sum, nil
}

// isAppend: every append kind lands its values at consecutive positions. An idempotent
// append is one operation from its first try to its client's last retry; an epoch-fenced
// append is a plain one to the model (fencing is a direct check, jepsen/checks.py).
func isAppend(f string) bool {
	return f == "append" || f == "append-idempotent" || f == "append-if-next" || f == "append-epoch"
}

// isRead: "read-min-position" reads are stale (not linearizable): not given to Porcupine,
// but what they returned still tells where an unknown append landed.
func isRead(f string) bool { return f == "read" || f == "read-min-position" }

func validate(rec record) error {
	switch {
	case rec.Process == nil || rec.Invoke == nil || rec.Complete == nil:
		return errors.New("process, invoke and complete are required")
	case *rec.Complete < *rec.Invoke:
		return errors.New("complete before invoke")
	case rec.Result != "ok" && rec.Result != "fail" && rec.Result != "info":
		return fmt.Errorf("result %q is not ok, fail or info", rec.Result)
	}
	switch {
	case isAppend(rec.F):
		if len(rec.Values) == 0 {
			return errors.New("an append needs values")
		}
		if rec.Result == "ok" && rec.Position == nil {
			return errors.New("a completed append needs its position")
		}
		if rec.F == "append-if-next" && rec.IfNext == nil {
			return errors.New("an append-if-next needs its if_next")
		}
	case isRead(rec.F):
		if rec.Result == "info" {
			return errors.New("a read has no unknown outcome: it changes nothing (use fail)")
		}
	case rec.F == "take-epoch":
	default:
		return fmt.Errorf("f %q is not an append, take-epoch or read kind", rec.F)
	}
	return nil
}

func parseEntries(raw [][2]json.RawMessage) ([]entry, error) {
	entries := make([]entry, 0, len(raw))
	for _, pair := range raw {
		var e entry
		if err := json.Unmarshal(pair[0], &e.Position); err != nil {
			return nil, fmt.Errorf("entry position: %v", err)
		}
		if err := json.Unmarshal(pair[1], &e.Value); err != nil {
			return nil, fmt.Errorf("entry value: %v", err)
		}
		if len(entries) > 0 && e.Position <= entries[len(entries)-1].Position {
			return nil, errors.New("a read's entries are not in increasing position order")
		}
		entries = append(entries, e)
	}
	return entries, nil
}

type summary struct {
	Verdict    string  `json:"verdict"`
	Operations int     `json:"operations"`
	Appends    int     `json:"appends"`
	Reads      int     `json:"reads"`
	Unknown    int     `json:"unknown"`
	Failed     int     `json:"failed"`
	Skipped    int     `json:"checked_directly"` // take-epoch and read-min-position
	Seconds    float64 `json:"check_seconds"`
}

func main() {
	visualize := flag.String("visualize", "", "write Porcupine's HTML visualization to this file (on a violation, or with -always-visualize)")
	always := flag.Bool("always-visualize", false, "write the visualization even when the history is linearizable")
	timeout := flag.Duration("timeout", 0, "give up after this long (exit 3); 0: no limit")
	asJSON := flag.Bool("json", false, "print the verdict as one JSON object")
	modelName := flag.String("model", "log", "log (appends and reads) or registers (fetch and compare-and-set store; registers.go)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: checker [flags] HISTORY.jsonl (- for stdin)\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	var input io.Reader = os.Stdin
	if path := flag.Arg(0); path != "-" {
		file, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "checker:", err)
			os.Exit(2)
		}
		defer file.Close()
		input = file
	}
	model := logModel
	parse := parseHistory
	switch *modelName {
	case "log":
	case "registers":
		model = registerModel.ToModel()
		parse = parseRegisterHistory
	default:
		fmt.Fprintf(os.Stderr, "checker: unknown model %q (log or registers)\n", *modelName)
		os.Exit(2)
	}
	ops, sum, err := parse(input)
	if err != nil {
		fmt.Fprintln(os.Stderr, "checker: bad history:", err)
		os.Exit(2)
	}

	start := time.Now()
	result, info := porcupine.CheckOperationsVerbose(model, ops, *timeout)
	sum.Seconds = time.Since(start).Seconds()

	status := 0
	switch result {
	case porcupine.Ok:
		sum.Verdict = "linearizable"
	case porcupine.Illegal:
		sum.Verdict = "not linearizable"
		status = 1
	default:
		sum.Verdict = "unknown (timed out)"
		status = 3
	}
	if *visualize != "" && (status == 1 || *always) {
		if err := porcupine.VisualizePath(model, info, *visualize); err != nil {
			fmt.Fprintln(os.Stderr, "checker: visualization:", err)
		}
	}
	if *asJSON {
		out, _ := json.Marshal(sum)
		fmt.Println(string(out))
	} else {
		fmt.Printf("%s: %d operations (%d appends, %d of them unknown; %d reads; %d failed dropped), checked in %.3f s\n",
			sum.Verdict, sum.Operations, sum.Appends, sum.Unknown, sum.Reads, sum.Failed, sum.Seconds)
	}
	os.Exit(status)
}
