// Work a worker does on its own thread in every turn of its loop, beside its
// NICs: the engine installs it (UVM watchers whose callbacks run on the worker,
// WatchOn::kWorker), the worker knows nothing of what it is. What a hook submits
// is posted in the same turn, with no thread crossing.
#pragma once

namespace ferry::core {

class TurnHook {
 public:
  virtual ~TurnHook() = default;
  // Called at the start of each turn, on the worker thread only. True when it
  // did something (the turn counts as busy).
  virtual bool run_wt() = 0;
  // While true the worker never blocks or naps (what the hook polls cannot wake
  // it); it still yields between turns where CPUs are few. Read each turn.
  virtual bool keeps_awake() const = 0;
};

}  // namespace ferry::core
