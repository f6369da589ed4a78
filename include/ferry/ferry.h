#pragma once
#include "ferry/engine.h"
#include "ferry/info.h"
#include "ferry/recv_queue.h"
#include "ferry/status.h"
#include "ferry/types.h"
#include "ferry/version.h"
