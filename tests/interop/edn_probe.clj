;; The reference side of tests/test_clojure_interop.py: clojure.edn reads, Clojure's printer writes.
;; One JVM serves the whole test session over stdin/stdout, one ASCII line per request and answer:
;;   read <base64 utf-8 text>  -> "ok <dump> <dump> ..." (every form) or "err <message>"
;;   gen <seed> <n>            -> n lines "<base64 pr-str text> <dump>": values Clojure made and printed
;;   ws                        -> "ok <hex> ..." every BMP code point clojure.edn treats as whitespace
;; A dump tags each value's type so "a"/:a, [1]/(1), 1/1N/1.0M and \a/"a" all differ.
(ns edn-probe
  (:require [clojure.edn :as edn]
            [clojure.string :as str])
  (:import (java.util Base64 Random UUID Date)
           (java.io PushbackReader StringReader BufferedReader InputStreamReader PrintWriter OutputStreamWriter)
           (java.nio.charset StandardCharsets)))

(defn hexs [^String s]
  (str/join "," (map #(Integer/toHexString %) (.toArray (.codePoints s)))))

(declare dump)

(defn- items [xs] (apply str (map #(str " " (dump %)) xs)))

(defn dump [x]
  (cond
    (nil? x) "nil"
    (true? x) "true"
    (false? x) "false"
    (instance? Long x) (str "(L " x ")")
    (or (instance? clojure.lang.BigInt x) (instance? BigInteger x)) (str "(N " x ")")
    (instance? Double x) (str "(D " (Long/toHexString (Double/doubleToLongBits x)) ")")
    (decimal? x) (str "(M " (.unscaledValue ^BigDecimal x) " " (.scale ^BigDecimal x) ")")
    (string? x) (str "(S " (hexs x) ")")
    (char? x) (str "(C " (Integer/toHexString (int x)) ")")
    (keyword? x) (str "(K " (hexs (subs (str x) 1)) ")")
    (symbol? x) (str "(Y " (hexs (str x)) ")")
    (map? x) (str "(A" (apply str (sort (map (fn [[k v]] (str " " (dump k) " " (dump v))) x))) ")")
    (vector? x) (str "(V" (items x) ")")
    (seq? x) (str "(P" (items x) ")")
    (set? x) (str "(H" (apply str (sort (map #(str " " (dump %)) x))) ")")
    (inst? x) (str "(T " (.getTime ^Date x) ")")
    (uuid? x) (str "(U " x ")")
    :else (str "(? " (.getName (class x)) ")")))

(def eof (Object.))

(defn read-all [^String text]
  (let [r (PushbackReader. (StringReader. text))]
    (loop [acc []]
      (let [v (edn/read {:eof eof} r)]
        (if (identical? v eof) acc (recur (conj acc v)))))))

(defn b64->str [s] (String. (.decode (Base64/getDecoder) ^String s) StandardCharsets/UTF_8))
(defn str->b64 [^String s] (.encodeToString (Base64/getEncoder) (.getBytes s StandardCharsets/UTF_8)))

(defn one-line [^String s] (str/replace (or s "") #"[\r\n]+" " "))

(defn answer-read [text]
  (try
    (str "ok" (apply str (map #(str " " (dump %)) (read-all text))))
    (catch Throwable e
      (str "err " (one-line (str (.getName (class e)) ": " (.getMessage e)
                                 (when-let [c (.getCause e)] (str " / " (.getMessage c)))))))))

;; ------------------------------------------------------------ the generated corpus

(defn- pick [^Random rnd xs] (nth xs (.nextInt rnd (count xs))))

(defn- rand-code-point [^Random rnd]
  (case (int (.nextInt rnd 7))
    0 (+ 0x20 (.nextInt rnd 95))                         ; printable ASCII
    1 (.nextInt rnd 0x20)                                ; C0 controls
    2 (pick rnd [0x7f 0x85 0xa0 0x2028 0x2029 0x3000 0xfeff 0x1c 0x0b])  ; awkward spaces
    3 (pick rnd [(int \") (int \\) (int \;) (int \#) (int \^) (int \newline)])
    4 (+ 0x10000 (.nextInt rnd (- 0x110000 0x10000)))   ; astral: a surrogate pair in Java
    (loop []                                             ; any other BMP scalar value
      (let [c (.nextInt rnd 0x10000)]
        (if (<= 0xd800 c 0xdfff) (recur) c)))))

(defn rand-string [^Random rnd]
  (let [sb (StringBuilder.)]
    (dotimes [_ (.nextInt rnd 12)] (.appendCodePoint sb (int (rand-code-point rnd))))
    (str sb)))

(defn rand-char [^Random rnd]
  (if (zero? (.nextInt rnd 3))
    (pick rnd [\newline \space \tab \backspace \formfeed \return \a \\ \( \] \; \# \u \o])
    (let [c (rand-code-point rnd)]
      (if (> c 0xffff) \x (char c)))))

(def name-first "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ*!_?$%&=<>")
(def name-rest (str name-first "0123456789.+-#'"))

(defn rand-name [^Random rnd]
  (let [n (.nextInt rnd 8)]
    (apply str (pick rnd name-first) (repeatedly n #(pick rnd name-rest)))))

(defn rand-keyword [^Random rnd]
  (case (int (.nextInt rnd 3))
    0 (keyword (rand-name rnd))
    1 (keyword "vllm" (rand-name rnd))
    (keyword (rand-name rnd) (rand-name rnd))))

(defn rand-double [^Random rnd]
  (case (int (.nextInt rnd 6))
    0 (pick rnd [##NaN ##Inf ##-Inf -0.0 0.0 Double/MIN_VALUE Double/MAX_VALUE 1.0E-5 1.0E21])
    1 (Double/longBitsToDouble (.nextLong rnd))
    (* (.nextGaussian rnd) (Math/pow 10.0 (- (.nextInt rnd 40) 20)))))

(defn rand-number [^Random rnd]
  (case (int (.nextInt rnd 6))
    0 (.nextLong rnd)
    1 (bigint (BigInteger. (+ 1 (.nextInt rnd 200)) rnd))          ; prints with N
    2 (bigint (.nextInt rnd 100))                                   ; 7N
    3 (BigDecimal. (BigInteger. (.nextInt rnd 120) rnd) (int (- (.nextInt rnd 40) 20)))
    (rand-double rnd)))

(defn rand-scalar [^Random rnd]
  (case (int (.nextInt rnd 10))
    0 nil
    1 (.nextBoolean rnd)
    2 (rand-number rnd)
    3 (rand-char rnd)
    4 (rand-keyword rnd)
    5 (symbol (rand-name rnd))
    6 (Date. (long (- (.nextLong rnd 4102444800000) 2208988800000)))
    7 (UUID. (.nextLong rnd) (.nextLong rnd))
    (rand-string rnd)))

(defn rand-key [^Random rnd]
  ;; keys whose equality Python and Clojure agree on (no 1 beside 1.0 or true, no \a beside "a")
  (case (int (.nextInt rnd 3)) 0 (rand-keyword rnd) 1 (rand-string rnd) (.nextInt rnd 1000)))

(declare rand-value)

(defn- with-rand-meta [^Random rnd v]
  (if (zero? (.nextInt rnd 4))
    (with-meta v (pick rnd [{:doc (rand-string rnd)} {:tag 'String} {(rand-keyword rnd) true}]))
    v))

(defn rand-coll [^Random rnd depth]
  (with-rand-meta rnd
    (case (int (.nextInt rnd 5))
      0 (vec (repeatedly (.nextInt rnd 4) #(rand-value rnd (inc depth))))
      1 (apply list (repeatedly (.nextInt rnd 4) #(rand-value rnd (inc depth))))
      2 (set (repeatedly (.nextInt rnd 4) #(rand-key rnd)))
      3 (into {} (repeatedly (.nextInt rnd 4) #(vector (rand-key rnd) (rand-value rnd (inc depth)))))
      (into {} (repeatedly (+ 1 (.nextInt rnd 4))           ; one namespace: prints as #:ns{...}
                           #(vector (keyword "vllm" (rand-name rnd)) (rand-value rnd (inc depth))))))))

(defn rand-value [^Random rnd depth]
  (if (or (> depth 3) (< (.nextInt rnd 10) 5)) (rand-scalar rnd) (rand-coll rnd depth)))

(defn rand-request [^Random rnd]
  (cond-> {:vllm/endpoint (pick rnd [:chat :completion :generate])
           :vllm/model (rand-string rnd)
           :vllm/messages [{:vllm/role (pick rnd [:system :user :assistant :tool])
                            :vllm/content (rand-string rnd)}]
           :vllm/sampling (cond-> {:vllm/temperature (rand-double rnd) :vllm/max-tokens (.nextLong rnd)}
                            (.nextBoolean rnd) (assoc :vllm/stop [(rand-string rnd) (rand-string rnd)])
                            (.nextBoolean rnd) (assoc :vllm/guided-json {:type "object" :n (rand-number rnd)}))
           :vllm/stream (.nextBoolean rnd)}
    (.nextBoolean rnd) (assoc :llamacpp/cache-prompt (.nextBoolean rnd)
                              :llamacpp/id-slot (.nextInt rnd 4))
    (.nextBoolean rnd) (assoc :sglang/extra {(rand-keyword rnd) (rand-value rnd 1)
                                             :nested [(rand-value rnd 1) #{(rand-key rnd)}]})
    (.nextBoolean rnd) (assoc :vllm/request-id (rand-value rnd 2))))

(defn gen-one [^Random rnd]
  (let [v (case (int (.nextInt rnd 3))
            0 (rand-request rnd)
            1 (with-rand-meta rnd (rand-request rnd))
            (rand-value rnd 0))
        text (binding [*print-namespace-maps* (.nextBoolean rnd)
                       *print-meta* true
                       *print-readably* true]
               (pr-str v))
        back (try (dump (first (read-all text))) (catch Throwable _ nil))]
    ;; only what Clojure itself reads back unchanged: the corpus is Clojure's own round trip
    (when (= back (dump v)) (str (str->b64 text) " " back))))

(def every-char-form
  ;; each named char, a char of every awkward kind, and their one-char strings beside them
  (let [cs (concat [\newline \space \tab \backspace \formfeed \return \a \u \o \\ \" \( \) \[ \] \{ \} \; \, \# \^ \' \@ \~ \`]
                   (map char [0 1 0x1b 0x1c 0x1f 0x7f 0x85 0xa0 0xad 0x2028 0x3000 0xfeff 0xfffd 0xffff]))]
    [(vec cs) (set (map str cs)) (apply list (map str cs))]))

(defn answer-gen [seed n]
  (let [rnd (Random. (long seed))
        fixed (binding [*print-readably* true] (pr-str every-char-form))]
    (loop [out [(str (str->b64 fixed) " " (dump (first (read-all fixed))))] tries 0]
      (if (or (>= (count out) n) (> tries (* 4 n)))
        out
        (let [line (gen-one rnd)]
          (recur (if line (conj out line) out) (inc tries)))))))

(defn whitespace []
  (str "ok" (apply str (for [c (range 0x10000) :when (or (Character/isWhitespace (int c)) (= c 44))]
                         (str " " (Integer/toHexString c))))))

(let [in (BufferedReader. (InputStreamReader. System/in StandardCharsets/UTF_8))
      out (PrintWriter. (OutputStreamWriter. System/out StandardCharsets/UTF_8) true)]
  (.println out "ready")
  (loop []
    (when-let [line (.readLine in)]
      (let [[op a b] (str/split line #" ")]
        (case op
          "read" (.println out ^String (answer-read (b64->str (or a ""))))
          "gen" (let [lines (answer-gen (Long/parseLong a) (Long/parseLong b))]
                  (.println out (str "ok " (count lines)))
                  (doseq [l lines] (.println out ^String l)))
          "ws" (.println out ^String (whitespace))
          (.println out (str "err unknown op " op))))
      (recur))))
